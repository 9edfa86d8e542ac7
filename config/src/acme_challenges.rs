//! The contract for answering ACME HTTP-01 challenges from every proxy of a fleet: the
//! operator PUTs the whole set of pending challenges to each proxy's admin listener, and each
//! proxy answers `GET /.well-known/acme-challenge/<token>` with the key authorization on every
//! listener, before routing. An empty set stops the answers.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Admin path taking `PUT` of an `AcmeChallenges` document (bearer token required).
pub const ACME_CHALLENGES_PATH: &str = "/acme-challenges";

/// Request path prefix the ACME server validates (RFC 8555 §8.3).
pub const ACME_CHALLENGE_PREFIX: &str = "/.well-known/acme-challenge/";

/// Most challenges a proxy holds at once (one per hostname of an order).
pub const MAX_ACME_CHALLENGES: usize = 100;

/// The pending HTTP-01 challenges: token → key authorization.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcmeChallenges {
    pub tokens: BTreeMap<String, String>,
}

/// A token as RFC 8555 §8.1 allows: base64url characters only, so it can never name a path.
pub fn is_valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= 256
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl AcmeChallenges {
    pub fn to_json(&self) -> String {
        // Plain data: serialising cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses and checks a document: at most `MAX_ACME_CHALLENGES`, valid tokens, key
    /// authorizations of the form `<token>.<thumbprint>`.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let doc: Self = serde_json::from_str(text).map_err(|e| e.to_string())?;
        if doc.tokens.len() > MAX_ACME_CHALLENGES {
            return Err(format!("more than {MAX_ACME_CHALLENGES} challenges"));
        }
        for (token, auth) in &doc.tokens {
            if !is_valid_token(token) {
                return Err(format!("token {token:?} is not base64url"));
            }
            let thumbprint = auth.strip_prefix(token.as_str()).and_then(|r| r.strip_prefix('.'));
            if !thumbprint.is_some_and(is_valid_token) {
                return Err(format!(
                    "the key authorization of {token:?} is not <token>.<thumbprint>"
                ));
            }
        }
        Ok(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_checked() {
        assert!(AcmeChallenges::from_json(r#"{"tokens":{"abc_-1":"abc_-1.thumb"}}"#).is_ok());
        assert!(AcmeChallenges::from_json(r#"{"tokens":{"../etc":"../etc.x"}}"#).is_err());
        assert!(AcmeChallenges::from_json(r#"{"tokens":{"abc":"other.thumb"}}"#).is_err());
        assert!(AcmeChallenges::from_json(r#"{"tokens":{"abc":"abc."}}"#).is_err());
        assert!(AcmeChallenges::from_json(r#"{"tokens":{},"extra":1}"#).is_err());
    }
}
