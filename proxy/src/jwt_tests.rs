use std::time::{SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use jsonwebtoken::{EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, Ed25519KeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::json;

use super::*;

/// A 2048-bit RSA test key (PKCS#1 DER), made with `openssl genrsa` for these tests only.
const RSA_DER: &str = "MIIEogIBAAKCAQEAwEROCHd5mNtGT0/TVgKVCy7rdKGfI624q/ILKaOmrqTwG7jyURJnt1ciDUbyHE9KuTL3Pt8c2bN0UOKFxJ/NsWkF3YkxwRVQL/YNjdJ1R1vAp/FWGsQaoVLPQLjB3w7ii3A1LPw+4kHSmiN18RASatHDiZtXQMJ1UxCe+x4ZbgSp8Bcnz3xYrqpjGS3ZlS7zd/I3IhcIRL91ABytJa8jIpReGfSrkY6goY9W9Uh9ZUz5+vbM4lPZ4xFHH2qkVgNWWCYkxj2vGF8IaC3jJNnmv3FWOPN1+hXDsLRVYhwID0q5v8HoIKXS0XNERWcQYi6VG5p1iNLsEr0p+kcCOz8RuQIDAQABAoIBACvkjBH3wI1KZds+ZIdKsJ7sd7lZGl0JUFMEv1Kity9AnUYe60bh1kavQClazHP1ECCGh5ZVVh9HDiNXC2XPe6RoTvv70Z18UaGZYQ/C/54qTqmoeVlD8rZoksL6Stwy6DogBCvAbFS35S3mMYs2eZXkTGkSSxGQMzui3ECE5xZL2T58IQh3acEQALTkIryfZmh24Cnu7dvKtu5z3/hNtCjShuTOWMLhW+ATVe6b7RIj2QbHnVCNBX+oDRehC0YUgr3DDg4MKsmow66aXaPNuc493ZBN9w4pWeiq3ULITJImM9H1l7bwo53vwgV399DA6VNJqvD5OYbP7vaqoC1jx3cCgYEA+iyJGtPOSdNCrxzM4KT1TMbM2BcQcx+4qcDj2r0zvA/BIQgR+T1AHU5SdIOHByNHvWlAvrq69nOsl73llYrby3zQh9RJSpdMK6a40ppvVJM+BKkGBVyCBIUXIiMwIQ6ZKrIg/MapbRI82VFaS0xTKkN8YbIvQkt8bEyA4VsF/MMCgYEAxL6LLQMzcJfW7QI5ifRoCZOMYiKCJnYG28o/r0Ba0O+vdOVgdU8g8XEBsuuwKyq+LprR89X09anVafXQmkkVX8AkAQpQ+xSOtiF9V4v1YyUP+uK5oab9U4/EJSTnYQ2q04kbzfjaBXSwhzdUMXFi45lHa9pVFTTdLaPkG9y5f9MCgYBIQe7DyeNuXU+IZogiZmLXbyAhVeARcFsU5LqrJjS4H9DHap5OX8uR61pTft3USPNimPDzZdm0b0qtdVLHc5jyWDWe1cjpe3Ors/b0FVkMk465J9yuVb7T8WDyIjm3gpDozRRMDlFHSJo8pouu7fejYGSfjyipPEZOvXYIIRNEowKBgBl1Dk0kvOM0wnqobwmKtmuGzANms7CGVRzbbqIekaG3YdyeUXzcYEbdeHrORF1Rioo9Pi1u4eNntlWfmP5dtoZNNltsGk5iupSWgMFzOq05fnfYHmzsTpshXx/vRoEoY5I7i317Vbqe/riAUESVh1Yr3zH1bkzwKi5dpoZ0aQxBAoGAdt68cRaq0CL/BWo9MCZMHOQ2YdyVhNvQd7xXJfEimbIT2QY0qIAuzz0/p0f2qFOtUTQ69wQy/O3Su0Ob0vHCGShRMGGGsdUoLdAyA6C8IyctFx4pLt6UcjuxB677ZHSud0U8m2EhQpy0eArNtzgIhTYN6ljZbComzEZJN2Tv2lc=";
const RSA_N: &str = "wEROCHd5mNtGT0_TVgKVCy7rdKGfI624q_ILKaOmrqTwG7jyURJnt1ciDUbyHE9KuTL3Pt8c2bN0UOKFxJ_NsWkF3YkxwRVQL_YNjdJ1R1vAp_FWGsQaoVLPQLjB3w7ii3A1LPw-4kHSmiN18RASatHDiZtXQMJ1UxCe-x4ZbgSp8Bcnz3xYrqpjGS3ZlS7zd_I3IhcIRL91ABytJa8jIpReGfSrkY6goY9W9Uh9ZUz5-vbM4lPZ4xFHH2qkVgNWWCYkxj2vGF8IaC3jJNnmv3FWOPN1-hXDsLRVYhwID0q5v8HoIKXS0XNERWcQYi6VG5p1iNLsEr0p-kcCOz8RuQ";

struct Signer {
    jwk: Value,
    key: EncodingKey,
    alg: Algorithm,
}

fn rsa(kid: &str) -> Signer {
    Signer {
        jwk: json!({"kty": "RSA", "kid": kid, "n": RSA_N, "e": "AQAB"}),
        key: EncodingKey::from_rsa_der(&STANDARD.decode(RSA_DER).unwrap()),
        alg: Algorithm::RS256,
    }
}

fn ec(kid: &str) -> Signer {
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &SystemRandom::new()).unwrap();
    let pair =
        EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &SystemRandom::new()).unwrap();
    let point = pair.public_key().as_ref();
    Signer {
        jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid,
                    "x": URL_SAFE_NO_PAD.encode(&point[1..33]), "y": URL_SAFE_NO_PAD.encode(&point[33..])}),
        key: EncodingKey::from_ec_der(pkcs8.as_ref()),
        alg: Algorithm::ES256,
    }
}

fn ed(kid: &str) -> Signer {
    let pkcs8 = Ed25519KeyPair::generate_pkcs8(&SystemRandom::new()).unwrap();
    let pair = Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap();
    Signer {
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "kid": kid, "x": URL_SAFE_NO_PAD.encode(pair.public_key().as_ref())}),
        key: EncodingKey::from_ed_der(pkcs8.as_ref()),
        alg: Algorithm::EdDSA,
    }
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

impl Signer {
    fn sign(&self, kid: Option<&str>, claims: Value) -> String {
        let mut h = Header::new(self.alg);
        h.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&h, &claims, &self.key).unwrap()
    }
    fn good(&self) -> String {
        self.sign(
            self.jwk["kid"].as_str(),
            json!({"iss": "https://issuer", "aud": "api", "exp": now() + 300, "sub": "alice",
                   "groups": ["a", "b"], "admin": true}),
        )
    }
}

fn config() -> JwtAuth {
    serde_json::from_value(json!({
        "issuer": "https://issuer", "audiences": ["api", "other"], "jwksFile": "/unused",
        "claimHeaders": [{"claim": "sub", "header": "x-user"}, {"claim": "groups", "header": "x-groups"},
                         {"claim": "admin", "header": "x-admin"}]
    }))
    .unwrap()
}

fn compiled(signers: &[&Signer], config: &JwtAuth) -> CompiledJwt {
    let set: JwkSet =
        serde_json::from_value(json!({"keys": signers.iter().map(|s| s.jwk.clone()).collect::<Vec<_>>()})).unwrap();
    CompiledJwt::from_set("api", config, &set).unwrap()
}

fn request(token: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(
        AUTHORIZATION,
        HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
    );
    h.insert("x-user", HeaderValue::from_static("forged"));
    h
}

#[test]
fn each_algorithm_admits_and_forwards_claims() {
    let (r, e, d) = (rsa("r1"), ec("e1"), ed("d1"));
    let jwt = compiled(&[&r, &e, &d], &config());
    for s in [&r, &e, &d] {
        let mut h = request(&s.good());
        assert_eq!(jwt.admit(&mut h), Ok(()), "{:?}", s.alg);
        assert_eq!(h["x-user"], "alice");
        assert_eq!(h["x-groups"], "a,b");
        assert_eq!(h["x-admin"], "true");
        assert!(h.get(AUTHORIZATION).is_none(), "the token is not forwarded by default");
    }
}

#[test]
fn refusals_say_why_and_remove_forged_claim_headers() {
    let (r, e) = (rsa("r1"), ec("e1"));
    let jwt = compiled(&[&e], &config());
    let claims = |extra: Value| {
        let mut c = json!({"iss": "https://issuer", "aud": "api", "exp": now() + 300});
        c.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        c
    };
    let cases = [
        (e.sign(Some("e1"), claims(json!({"exp": now() - 120}))), Denial::Expired),
        (
            e.sign(Some("e1"), claims(json!({"nbf": now() + 600}))),
            Denial::NotYetValid,
        ),
        (
            e.sign(Some("e1"), claims(json!({"iss": "https://evil"}))),
            Denial::Issuer,
        ),
        (
            e.sign(Some("e1"), claims(json!({"aud": "elsewhere"}))),
            Denial::Audience,
        ),
        (
            e.sign(Some("e1"), json!({"iss": "https://issuer", "exp": now() + 300})),
            Denial::Audience,
        ),
        (e.sign(Some("nope"), claims(json!({}))), Denial::UnknownKey),
        (ec("e1").sign(Some("e1"), claims(json!({}))), Denial::Signature),
        (r.sign(Some("r1"), claims(json!({}))), Denial::UnknownKey),
        ("not.a.jwt".to_string(), Denial::Malformed),
    ];
    for (token, want) in cases {
        let mut h = request(&token);
        assert_eq!(jwt.admit(&mut h), Err(want));
        assert!(h.get("x-user").is_none(), "a forged claim header never passes");
    }
    let mut h = HeaderMap::new();
    assert_eq!(jwt.admit(&mut h), Err(Denial::Missing));
    assert_eq!(Denial::Missing.challenge("api"), "Bearer realm=\"api\"");
    assert!(Denial::Expired
        .challenge("api")
        .to_str()
        .unwrap()
        .contains("error=\"invalid_token\""));
}

#[test]
fn skew_algorithms_and_token_forwarding_follow_the_config() {
    let e = ec("e1");
    let mut c = config();
    c.clock_skew = proxyfleet_config::HumanDuration::from_secs(300);
    c.forward_token = true;
    let jwt = compiled(&[&e], &c);
    let token = e.sign(
        Some("e1"),
        json!({"iss": "https://issuer", "aud": "other", "exp": now() - 60}),
    );
    let mut h = request(&token);
    assert_eq!(jwt.admit(&mut h), Ok(()), "within the clock skew");
    assert!(h.get(AUTHORIZATION).is_some());

    c.algorithms = vec![JwtAlgorithm::RS256];
    let set: JwkSet = serde_json::from_value(json!({"keys": [e.jwk]})).unwrap();
    assert!(
        CompiledJwt::from_set("api", &c, &set).is_none(),
        "no key the route accepts"
    );
}

#[test]
fn a_token_without_kid_tries_each_key_of_its_algorithm() {
    let (a, b) = (ec("a"), ec("b"));
    let jwt = compiled(&[&a, &b], &config());
    let token = b.sign(None, json!({"iss": "https://issuer", "aud": "api", "exp": now() + 60}));
    assert_eq!(jwt.admit(&mut request(&token)), Ok(()));
}
