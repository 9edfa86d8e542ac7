//! OCSP stapling: the response stored beside a certificate (`tls.ocsp` in its Secret) is
//! stapled only when it is a successful basic response for this very certificate (serial and
//! issuer name hash), says `good`, and is fresh. The signature is the client's to verify; we
//! never staple something that would make a client reject a good certificate for a reason we
//! can see ourselves. Pure: the time is an argument.

use der::oid::ObjectIdentifier;
use der::Decode;
use sha1::Digest;
use x509_ocsp::{BasicOcspResponse, CertId, CertStatus, OcspGeneralizedTime, OcspResponse, OcspResponseStatus};

const ID_PKIX_OCSP_BASIC: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.48.1.1");
const ID_SHA1: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.14.3.2.26");
const ID_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.16.840.1.101.3.4.2.1");

/// How long a response without `nextUpdate` counts as fresh after its `thisUpdate`.
const FRESH_WITHOUT_NEXT_UPDATE_SECS: i64 = 7 * 24 * 3600;
/// A `thisUpdate` up to this far in the future is accepted (clocks differ).
const CLOCK_SKEW_SECS: i64 = 300;

/// Why a response is not stapled (the `result` label of its counter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Not a DER OCSP response with a basic response inside.
    Invalid,
    /// The responder answered with an error status (tryLater, unauthorized...).
    NotSuccessful,
    /// It is about another certificate.
    Mismatched,
    /// The certificate is revoked or unknown to the responder.
    NotGood,
    /// `nextUpdate` has passed, or `thisUpdate` is in the future.
    Stale,
}

impl Refusal {
    pub fn label(self) -> &'static str {
        match self {
            Refusal::Invalid => "invalid",
            Refusal::NotSuccessful => "not_successful",
            Refusal::Mismatched => "mismatched",
            Refusal::NotGood => "not_good",
            Refusal::Stale => "stale",
        }
    }
}

/// A response fit to staple, and until when (unix seconds).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Staple {
    pub der: Vec<u8>,
    pub valid_until_unix: i64,
}

fn unix(t: &OcspGeneralizedTime) -> i64 {
    i64::try_from(t.0.to_unix_duration().as_secs()).unwrap_or(i64::MAX)
}

/// Checks `response` (DER) against the leaf certificate (DER) at `now_unix`.
pub fn check(response: &[u8], leaf: &[u8], now_unix: i64) -> Result<Staple, Refusal> {
    let outer = OcspResponse::from_der(response).map_err(|_| Refusal::Invalid)?;
    if outer.response_status != OcspResponseStatus::Successful {
        return Err(Refusal::NotSuccessful);
    }
    let bytes = outer.response_bytes.ok_or(Refusal::Invalid)?;
    if bytes.response_type != ID_PKIX_OCSP_BASIC {
        return Err(Refusal::Invalid);
    }
    let basic = BasicOcspResponse::from_der(bytes.response.as_bytes()).map_err(|_| Refusal::Invalid)?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf).map_err(|_| Refusal::Mismatched)?;
    let single = basic
        .tbs_response_data
        .responses
        .iter()
        .find(|r| is_for(&r.cert_id, cert.raw_serial(), cert.issuer().as_raw()))
        .ok_or(Refusal::Mismatched)?;
    if !matches!(single.cert_status, CertStatus::Good(_)) {
        return Err(Refusal::NotGood);
    }
    let this_update = unix(&single.this_update);
    let until = match &single.next_update {
        Some(next) => unix(next),
        None => this_update.saturating_add(FRESH_WITHOUT_NEXT_UPDATE_SECS),
    };
    if this_update > now_unix + CLOCK_SKEW_SECS || until <= now_unix {
        return Err(Refusal::Stale);
    }
    Ok(Staple {
        der: response.to_vec(),
        valid_until_unix: until,
    })
}

/// Whether a CertID names the certificate with this serial and issuer (DER name).
fn is_for(id: &CertId, serial: &[u8], issuer: &[u8]) -> bool {
    if id.serial_number.as_bytes() != serial {
        return false;
    }
    let name_hash = id.issuer_name_hash.as_bytes();
    match id.hash_algorithm.oid {
        ID_SHA1 => sha1::Sha1::digest(issuer).as_slice() == name_hash,
        ID_SHA256 => sha2::Sha256::digest(issuer).as_slice() == name_hash,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der_of(pem: &[u8]) -> Vec<u8> {
        use rustls::pki_types::pem::PemObject;
        rustls::pki_types::CertificateDer::from_pem_slice(pem).unwrap().to_vec()
    }

    const GOOD: &[u8] = include_bytes!("../testdata/ocsp/good.pem");
    const REVOKED: &[u8] = include_bytes!("../testdata/ocsp/revoked.pem");
    const GOOD_OCSP: &[u8] = include_bytes!("../testdata/ocsp/good.ocsp.der");
    const GOOD_OCSP_SHA256: &[u8] = include_bytes!("../testdata/ocsp/good.sha256.ocsp.der");
    const REVOKED_OCSP: &[u8] = include_bytes!("../testdata/ocsp/revoked.ocsp.der");

    /// The fixture's thisUpdate (make.sh signs with -ndays 4).
    fn this_update(response: &[u8]) -> i64 {
        let outer = OcspResponse::from_der(response).unwrap();
        let basic = BasicOcspResponse::from_der(outer.response_bytes.unwrap().response.as_bytes()).unwrap();
        unix(&basic.tbs_response_data.responses[0].this_update)
    }

    #[test]
    fn a_fresh_good_response_for_the_certificate_is_stapled() {
        let leaf = der_of(GOOD);
        for response in [GOOD_OCSP, GOOD_OCSP_SHA256] {
            let now = this_update(response) + 3600;
            let staple = check(response, &leaf, now).unwrap();
            assert_eq!(staple.der, response);
            assert_eq!(staple.valid_until_unix, this_update(response) + 4 * 24 * 3600);
        }
    }

    #[test]
    fn stale_mismatched_revoked_and_garbage_are_refused() {
        let (good, revoked) = (der_of(GOOD), der_of(REVOKED));
        let t = this_update(GOOD_OCSP);
        assert_eq!(check(GOOD_OCSP, &good, t + 4 * 24 * 3600), Err(Refusal::Stale));
        assert_eq!(check(GOOD_OCSP, &good, t - 3600), Err(Refusal::Stale));
        assert!(check(GOOD_OCSP, &good, t - 60).is_ok(), "clock skew is tolerated");
        assert_eq!(check(GOOD_OCSP, &revoked, t + 1), Err(Refusal::Mismatched));
        assert_eq!(check(REVOKED_OCSP, &revoked, t + 1), Err(Refusal::NotGood));
        assert_eq!(check(b"not ocsp", &good, t), Err(Refusal::Invalid));
        // tryLater: OCSPResponse { responseStatus 3 }.
        assert_eq!(
            check(&[0x30, 0x03, 0x0a, 0x01, 0x03], &good, t),
            Err(Refusal::NotSuccessful)
        );
    }
}
