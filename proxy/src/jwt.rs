//! Per-route JWT validation: the key set (a JWKS file, re-read on reload), the checks, and the
//! claims copied into request headers. Tokens are never logged, only why they were refused.

use std::collections::HashSet;

use http::header::{HeaderName, HeaderValue, AUTHORIZATION};
use http::HeaderMap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::{Map, Value};

use prometheus_client::metrics::counter::Counter;

use proxyfleet_config::{JwtAlgorithm, JwtAuth};

use crate::metrics::{Metrics, RouteReasonLabels};

#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    #[error("reading JWKS {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("JWKS {path} is not a JSON Web Key Set: {source}")]
    Parse { path: String, source: serde_json::Error },
    #[error("JWKS {path} has no RS256, ES256 (P-256) or EdDSA (Ed25519) key the route accepts")]
    NoUsableKey { path: String },
}

/// Why a request was refused; also the `reason` label of the denial counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Denial {
    Missing,
    Malformed,
    Algorithm,
    UnknownKey,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
}

impl Denial {
    const ALL: [Denial; 9] = [
        Denial::Missing,
        Denial::Malformed,
        Denial::Algorithm,
        Denial::UnknownKey,
        Denial::Signature,
        Denial::Expired,
        Denial::NotYetValid,
        Denial::Issuer,
        Denial::Audience,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Denial::Missing => "missing",
            Denial::Malformed => "malformed",
            Denial::Algorithm => "algorithm",
            Denial::UnknownKey => "unknown_key",
            Denial::Signature => "signature",
            Denial::Expired => "expired",
            Denial::NotYetValid => "not_yet_valid",
            Denial::Issuer => "issuer",
            Denial::Audience => "audience",
        }
    }

    /// The RFC 6750 `error_description`.
    fn description(self) -> &'static str {
        match self {
            Denial::Missing => "no bearer token",
            Denial::Malformed => "the token is not a well-formed JWT",
            Denial::Algorithm => "the token's algorithm is not accepted",
            Denial::UnknownKey => "no key of the key set matches the token",
            Denial::Signature => "the signature does not verify",
            Denial::Expired => "the token has expired",
            Denial::NotYetValid => "the token is not valid yet",
            Denial::Issuer => "the token's issuer is not accepted",
            Denial::Audience => "the token's audience is not accepted",
        }
    }

    fn of(kind: &jsonwebtoken::errors::ErrorKind) -> Self {
        use jsonwebtoken::errors::ErrorKind as K;
        match kind {
            K::InvalidSignature => Denial::Signature,
            K::ExpiredSignature => Denial::Expired,
            K::ImmatureSignature => Denial::NotYetValid,
            K::InvalidIssuer => Denial::Issuer,
            K::InvalidAudience => Denial::Audience,
            K::InvalidAlgorithm | K::MissingAlgorithm => Denial::Algorithm,
            K::MissingRequiredClaim(c) if c == "aud" => Denial::Audience,
            K::MissingRequiredClaim(c) if c == "iss" => Denial::Issuer,
            K::MissingRequiredClaim(_) => Denial::Malformed,
            _ => Denial::Malformed,
        }
    }

    /// The `WWW-Authenticate` value: no error code without a token (RFC 6750 §3.1).
    pub fn challenge(self, realm: &str) -> HeaderValue {
        let v = match self {
            Denial::Missing => format!("Bearer realm=\"{realm}\""),
            d => format!(
                "Bearer realm=\"{realm}\", error=\"invalid_token\", error_description=\"{}\"",
                d.description()
            ),
        };
        HeaderValue::from_str(&v).unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
    }
}

struct Key {
    kid: Option<String>,
    algorithm: Algorithm,
    key: DecodingKey,
}

/// A route's compiled `jwt`.
pub struct CompiledJwt {
    keys: Vec<Key>,
    /// One validation per accepted algorithm (the crate checks a key's family against each).
    validations: Vec<(Algorithm, Validation)>,
    forward_token: bool,
    claim_headers: Vec<(String, HeaderName)>,
    /// The route name, as the challenge's realm.
    pub realm: String,
    /// Denials counted by reason, in `Denial::ALL` order.
    denied: Vec<Counter>,
}

fn algorithm(a: JwtAlgorithm) -> Algorithm {
    match a {
        JwtAlgorithm::RS256 => Algorithm::RS256,
        JwtAlgorithm::ES256 => Algorithm::ES256,
        JwtAlgorithm::EdDSA => Algorithm::EdDSA,
    }
}

/// The algorithm a JWK is used with here, if it is one we accept.
fn key_algorithm(params: &AlgorithmParameters) -> Option<Algorithm> {
    match params {
        AlgorithmParameters::RSA(_) => Some(Algorithm::RS256),
        AlgorithmParameters::EllipticCurve(p) if p.curve == EllipticCurve::P256 => Some(Algorithm::ES256),
        AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => Some(Algorithm::EdDSA),
        _ => None,
    }
}

fn validation(config: &JwtAuth, alg: Algorithm) -> Validation {
    let mut v = Validation::new(alg);
    v.leeway = config.clock_skew.get().as_secs();
    v.validate_nbf = true;
    if let Some(iss) = &config.issuer {
        v.set_issuer(&[iss]);
        v.required_spec_claims.insert("iss".into());
    }
    if config.audiences.is_empty() {
        v.validate_aud = false;
    } else {
        v.set_audience(&config.audiences);
        v.required_spec_claims.insert("aud".into());
    }
    v
}

impl CompiledJwt {
    /// Reads the key set the route names. Keys of other kinds or algorithms are skipped; a
    /// set with none left is an error, so a bad key file never replaces a good one.
    pub fn load(route: &str, config: &JwtAuth, metrics: &Metrics) -> Result<Self, JwksError> {
        let path = config.jwks_file.clone().unwrap_or_default();
        let text = std::fs::read(&path).map_err(|source| JwksError::Read {
            path: path.clone(),
            source,
        })?;
        let set: JwkSet = serde_json::from_slice(&text).map_err(|source| JwksError::Parse {
            path: path.clone(),
            source,
        })?;
        let mut jwt = Self::from_set(route, config, &set).ok_or(JwksError::NoUsableKey { path })?;
        jwt.denied = Denial::ALL
            .iter()
            .map(|d| {
                metrics
                    .jwt_denied
                    .get_or_create(&RouteReasonLabels {
                        route: route.to_string(),
                        reason: d.label(),
                    })
                    .clone()
            })
            .collect();
        Ok(jwt)
    }

    fn from_set(route: &str, config: &JwtAuth, set: &JwkSet) -> Option<Self> {
        let accepted: HashSet<Algorithm> = if config.algorithms.is_empty() {
            JwtAlgorithm::ALL.into_iter().map(algorithm).collect()
        } else {
            config.algorithms.iter().copied().map(algorithm).collect()
        };
        let keys: Vec<Key> = set
            .keys
            .iter()
            .filter_map(|jwk| {
                let algorithm = key_algorithm(&jwk.algorithm).filter(|a| accepted.contains(a))?;
                Some(Key {
                    kid: jwk.common.key_id.clone(),
                    algorithm,
                    key: DecodingKey::from_jwk(jwk).ok()?,
                })
            })
            .collect();
        if keys.is_empty() {
            return None;
        }
        let validations = accepted.into_iter().map(|a| (a, validation(config, a))).collect();
        let claim_headers = config
            .claim_headers
            .iter()
            .filter_map(|c| Some((c.claim.clone(), HeaderName::from_bytes(c.header.as_bytes()).ok()?)))
            .collect();
        Some(Self {
            keys,
            validations,
            forward_token: config.forward_token,
            claim_headers,
            realm: route.to_string(),
            denied: Vec::new(),
        })
    }

    /// Checks the request's bearer token; on success rewrites the request headers: claim
    /// headers set (client-sent ones removed first), the token removed unless forwarded.
    pub fn admit(&self, headers: &mut HeaderMap) -> Result<(), Denial> {
        for (_, h) in &self.claim_headers {
            headers.remove(h);
        }
        let claims = self.verify(headers).inspect_err(|d| {
            if let Some(c) = self.denied.get(*d as usize) {
                c.inc();
            }
        })?;
        for (claim, h) in &self.claim_headers {
            if let Some(v) = claims.get(claim).and_then(header_value) {
                headers.insert(h.clone(), v);
            }
        }
        if !self.forward_token {
            headers.remove(AUTHORIZATION);
        }
        Ok(())
    }

    fn verify(&self, headers: &HeaderMap) -> Result<Map<String, Value>, Denial> {
        let token = bearer_token(headers).ok_or(Denial::Missing)?;
        let header = jsonwebtoken::decode_header(token).map_err(|_| Denial::Malformed)?;
        let (_, validation) = self
            .validations
            .iter()
            .find(|(a, _)| *a == header.alg)
            .ok_or(Denial::Algorithm)?;
        let mut last = Denial::UnknownKey;
        let candidates = self
            .keys
            .iter()
            .filter(|k| k.algorithm == header.alg && (header.kid.is_none() || k.kid == header.kid));
        for k in candidates {
            match jsonwebtoken::decode::<Map<String, Value>>(token, &k.key, validation) {
                Ok(data) => return Ok(data.claims),
                Err(e) => last = Denial::of(e.kind()),
            }
            // Only a bad signature may be another key's token; any other failure is final.
            if last != Denial::Signature {
                break;
            }
        }
        Err(last)
    }
}

/// `Authorization: Bearer <token>` (scheme case-insensitive, RFC 6750 §2.1).
fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let v = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A claim as a header value: strings as they are, arrays of strings joined with `,`, other
/// values as JSON. None when the result is not a valid header value.
fn header_value(v: &Value) -> Option<HeaderValue> {
    let text = match v {
        Value::String(s) => s.clone(),
        Value::Array(items) if items.iter().all(Value::is_string) => {
            items.iter().filter_map(Value::as_str).collect::<Vec<_>>().join(",")
        }
        Value::Null => return None,
        other => other.to_string(),
    };
    HeaderValue::from_str(&text).ok()
}

#[cfg(test)]
#[path = "jwt_tests.rs"]
mod tests;
