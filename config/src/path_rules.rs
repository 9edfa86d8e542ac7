//! How the proxy reads a request path beyond RFC 3986's equivalences, which it always applies
//! (unreserved escapes decoded, dot segments removed): what an escaped slash and an empty
//! segment mean. Those depend on the upstream, so they are choices (Envoy's
//! `path_with_escaped_slashes_action` and `merge_slashes`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What the proxy does with `%2F` in a request path: `keep` (default: forwarded as sent, not a
/// segment boundary), `reject` (400, also for `%5C` and a raw `\`) or `decode` (read and
/// forwarded as `/`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum EscapedSlashes {
    /// Forward as sent (default): `%2F` is not a segment boundary, so `/api%2F..%2Fadmin` is
    /// routed as one segment under `/api`. Right for upstreams that keep `%2F` as data
    /// (object stores, APIs with names holding `/`).
    #[default]
    Keep,
    /// Answer 400: no route meant for a path can be passed by an upstream that decodes `%2F`
    /// before it routes, nor by one that reads `\` as a separator (Windows, IIS): `%5C` and a
    /// raw `\` are refused too.
    Reject,
    /// Decode `%2F` to `/` before routing and forward the decoded path (its dot segments then
    /// removed): routing sees the segments such an upstream will see. `%5C` is kept.
    Decode,
}

/// The path rules of `limits`, defaulted: what the request path's normalization reads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PathRules {
    pub escaped_slashes: EscapedSlashes,
    /// `//` is read and forwarded as `/` (nginx's `merge_slashes`).
    pub merge_slashes: bool,
}
