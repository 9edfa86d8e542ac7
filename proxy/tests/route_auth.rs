//! Integration tests of per-route JWT validation and CORS through a real listener: tokens
//! signed in the test process against a JWKS file the proxy reads and hot-reloads, claims
//! forwarded to the upstream, preflights answered by the proxy. No timing assertions.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair, ECDSA_P256_SHA256_FIXED_SIGNING};
use serde_json::json;

use support::*;

struct Key {
    kid: &'static str,
    pkcs8: Vec<u8>,
    jwk: serde_json::Value,
}

fn key(kid: &'static str) -> Key {
    let rng = SystemRandom::new();
    let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng).unwrap();
    let pair = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng).unwrap();
    let p = pair.public_key().as_ref();
    Key {
        kid,
        pkcs8: pkcs8.as_ref().to_vec(),
        jwk: json!({"kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                    "x": URL_SAFE_NO_PAD.encode(&p[1..33]), "y": URL_SAFE_NO_PAD.encode(&p[33..])}),
    }
}

impl Key {
    fn token(&self, exp_in: i64) -> String {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some(self.kid.into());
        let claims = json!({"iss": "https://issuer.test", "aud": "shop", "sub": "alice", "exp": now + exp_in});
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_ec_der(&self.pkcs8)).unwrap()
    }
}

fn jwks(keys: &[&Key]) -> String {
    json!({"keys": keys.iter().map(|k| k.jwk.clone()).collect::<Vec<_>>()}).to_string()
}

fn config(upstream: std::net::SocketAddr, jwks_file: &str) -> String {
    format!(
        r#"
listeners:
  - {{name: http, address: "127.0.0.1:0"}}
admin: {{address: "127.0.0.1:0"}}
drain: {{gracePeriod: 100ms, deadline: 5s}}
routes:
  - name: api
    match: {{pathPrefix: /api}}
    upstream: u
    jwt: {{issuer: "https://issuer.test", audiences: [shop], jwksFile: "{jwks_file}", clockSkew: 5s,
           claimHeaders: [{{claim: sub, header: x-user}}]}}
    cors: {{allowOrigins: ["https://app.example.com"], allowMethods: [GET, PUT], allowHeaders: [authorization],
            allowCredentials: true, maxAge: 10m}}
  - {{name: public, upstream: u}}
upstreams:
  - name: u
    endpoints: ["{upstream}"]
"#
    )
}

fn request(path: &str, extra: &str) -> Vec<u8> {
    format!("GET {path} HTTP/1.1\r\nHost: shop.test\r\n{extra}Connection: close\r\n\r\n").into_bytes()
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_admits_valid_tokens_forwards_claims_and_refuses_the_rest() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("jwt");
    let (k1, k2) = (key("k1"), key("k2"));
    let jwks_file = write(&dir, "jwks.json", &jwks(&[&k1]));
    let proxy = start_proxy(&dir, &config(up.addr, &jwks_file)).await;
    let a = proxy.addr("http");

    let ok = raw(
        a,
        &request("/api/x", &format!("{}X-User: mallory\r\n", bearer(&k1.token(60)))),
    )
    .await;
    assert!(ok.starts_with("HTTP/1.1 200"), "{ok}");
    let seen = up.stats.last_headers.lock().unwrap().clone().unwrap();
    assert_eq!(seen["x-user"], "alice", "the claim, not the client's header");
    assert!(seen.get("authorization").is_none(), "the token stops at the proxy");

    let missing = raw(a, &request("/api/x", "")).await;
    assert!(missing.starts_with("HTTP/1.1 401"), "{missing}");
    assert!(
        missing
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer realm=\"api\""),
        "{missing}"
    );
    let expired = raw(a, &request("/api/x", &bearer(&k1.token(-60)))).await;
    assert!(
        expired.starts_with("HTTP/1.1 401") && expired.contains("the token has expired"),
        "{expired}"
    );
    let unknown = raw(a, &request("/api/x", &bearer(&k2.token(60)))).await;
    assert!(unknown.starts_with("HTTP/1.1 401"), "{unknown}");
    let garbage = raw(a, &request("/api/x", "Authorization: Bearer a.b\r\n")).await;
    assert!(garbage.starts_with("HTTP/1.1 401"), "{garbage}");
    assert_eq!(
        get(a, "shop.test", "/open").await.0,
        200,
        "another route needs no token"
    );

    let m = metrics(&proxy).await;
    for reason in ["missing", "expired", "unknown_key", "malformed"] {
        let n = metric_sum(
            &m,
            "proxyfleet_jwt_denied_requests_total",
            &["route=\"api\"", &format!("reason=\"{reason}\"")],
        );
        assert_eq!(n, 1.0, "{reason}");
    }

    // Key rotation: the key set file changes (as a mounted Secret does) and k2 is accepted
    // after the reload; k1 is gone.
    std::fs::write(&jwks_file, jwks(&[&k2])).unwrap();
    let mut status = 0;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        status = raw(a, &request("/api/x", &bearer(&k2.token(60)))).await[9..12]
            .parse()
            .unwrap_or(0);
        if status == 200 {
            break;
        }
    }
    assert_eq!(status, 200, "the rotated key set was not reloaded");
    assert!(raw(a, &request("/api/x", &bearer(&k1.token(60))))
        .await
        .starts_with("HTTP/1.1 401"));
    // A broken key set is refused; the running one stays.
    std::fs::write(&jwks_file, "{\"keys\": []}").unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(raw(a, &request("/api/x", &bearer(&k2.token(60))))
        .await
        .starts_with("HTTP/1.1 200"));
    proxy.running.drain();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_preflights_are_answered_and_responses_carry_the_headers() {
    init();
    let up = upstream("up", None, false).await;
    let dir = tempdir("cors");
    let k = key("k1");
    let jwks_file = write(&dir, "jwks.json", &jwks(&[&k]));
    let proxy = start_proxy(&dir, &config(up.addr, &jwks_file)).await;
    let a = proxy.addr("http");
    let before = up.stats.requests.load(std::sync::atomic::Ordering::Relaxed);

    let pre = raw(
        a,
        b"OPTIONS /api/x HTTP/1.1\r\nHost: shop.test\r\nOrigin: https://app.example.com\r\nAccess-Control-Request-Method: PUT\r\nAccess-Control-Request-Headers: authorization\r\nConnection: close\r\n\r\n",
    )
    .await
    .to_ascii_lowercase();
    assert!(pre.starts_with("http/1.1 204"), "a preflight needs no token: {pre}");
    assert!(
        pre.contains("access-control-allow-origin: https://app.example.com"),
        "{pre}"
    );
    assert!(pre.contains("access-control-allow-methods: get, put"), "{pre}");
    assert!(pre.contains("access-control-allow-credentials: true"), "{pre}");
    assert!(pre.contains("access-control-max-age: 600"), "{pre}");
    let refused = raw(
        a,
        b"OPTIONS /api/x HTTP/1.1\r\nHost: shop.test\r\nOrigin: https://evil.example\r\nAccess-Control-Request-Method: PUT\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(
        refused.starts_with("HTTP/1.1 403") && refused.contains("origin not allowed"),
        "{refused}"
    );
    assert_eq!(
        up.stats.requests.load(std::sync::atomic::Ordering::Relaxed),
        before,
        "preflights stop at the proxy"
    );

    let actual = raw(
        a,
        &request(
            "/api/x",
            &format!("Origin: https://app.example.com\r\n{}", bearer(&k.token(60))),
        ),
    )
    .await;
    let lower = actual.to_ascii_lowercase();
    assert!(lower.starts_with("http/1.1 200"), "{actual}");
    assert!(
        lower.contains("access-control-allow-origin: https://app.example.com") && lower.contains("vary: origin"),
        "{actual}"
    );
    let denied = raw(a, &request("/api/x", "Origin: https://app.example.com\r\n"))
        .await
        .to_ascii_lowercase();
    assert!(
        denied.starts_with("http/1.1 401") && denied.contains("access-control-allow-origin"),
        "a browser can read the 401: {denied}"
    );
    let other = raw(
        a,
        &request(
            "/api/x",
            &format!("Origin: https://evil.example\r\n{}", bearer(&k.token(60))),
        ),
    )
    .await;
    assert!(
        !other.to_ascii_lowercase().contains("access-control-allow-origin"),
        "{other}"
    );
    let m = metrics(&proxy).await;
    assert_eq!(
        metric_sum(&m, "proxyfleet_cors_preflights_total", &["result=\"allowed\""]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "proxyfleet_cors_preflights_total", &["result=\"refused\""]),
        1.0
    );
    proxy.running.drain();
}
