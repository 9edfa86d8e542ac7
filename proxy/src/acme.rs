//! ACME HTTP-01 answers: the challenges the operator pushed (`PUT /acme-challenges` on the
//! admin listener) answered on every listener before routing, so one order validates however
//! many replicas the Service balances over. A token not held falls through to the routes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use proxyfleet_config::{AcmeChallenges, ACME_CHALLENGE_PREFIX};

use crate::body::{self, ClientBody};

/// The challenges held. `any` keeps the request path to one relaxed load when there are none.
#[derive(Default)]
pub struct AcmeAnswers {
    any: AtomicBool,
    tokens: Mutex<BTreeMap<String, String>>,
}

impl AcmeAnswers {
    /// Replaces the whole set (an empty document stops the answers).
    pub fn replace(&self, doc: AcmeChallenges) {
        let mut tokens = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        self.any.store(!doc.tokens.is_empty(), Ordering::Relaxed);
        *tokens = doc.tokens;
    }

    /// Tokens held, for the admin report.
    pub fn tokens(&self) -> Vec<String> {
        self.tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// The answer to a challenge request, when it is one for a token held.
    pub fn answer<B>(&self, req: &Request<B>) -> Option<Response<ClientBody>> {
        if !self.any.load(Ordering::Relaxed) || !(req.method() == Method::GET || req.method() == Method::HEAD) {
            return None;
        }
        let token = req.uri().path().strip_prefix(ACME_CHALLENGE_PREFIX)?;
        let auth = self
            .tokens
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned()?;
        let mut r = Response::new(body::full_owned(auth));
        *r.status_mut() = StatusCode::OK;
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
        Some(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(path: &str) -> Request<()> {
        Request::get(path).body(()).expect("request")
    }

    #[test]
    fn answers_only_tokens_held() {
        let a = AcmeAnswers::default();
        assert!(a.answer(&get("/.well-known/acme-challenge/tok")).is_none());
        a.replace(AcmeChallenges {
            tokens: BTreeMap::from([("tok".to_string(), "tok.thumb".to_string())]),
        });
        assert_eq!(
            a.answer(&get("/.well-known/acme-challenge/tok")).map(|r| r.status()),
            Some(StatusCode::OK)
        );
        assert!(a.answer(&get("/.well-known/acme-challenge/other")).is_none());
        assert!(a.answer(&get("/tok")).is_none());
        let post = Request::post("/.well-known/acme-challenge/tok")
            .body(())
            .expect("request");
        assert!(a.answer(&post).is_none());
        a.replace(AcmeChallenges::default());
        assert!(a.answer(&get("/.well-known/acme-challenge/tok")).is_none());
        assert!(a.tokens().is_empty());
    }
}
