//! The request path as routing and the upstream see it: RFC 3986 §6.2.2 normalization, so a
//! path that an upstream would read as another cannot pass a route meant for that other one
//! (a route's JWT check, say) by spelling it differently.
//! - Percent-encoded unreserved characters are decoded (`/%61dmin` is `/admin`, `%2e` is `.`).
//!   Other escapes stay as sent: `%2F` is not a segment boundary, and decoding it would change
//!   what the upstream receives; unless `limits.escapedSlashes` says to refuse or decode it.
//! - With `limits.mergeSlashes`, `//` is `/`.
//! - Dot segments are removed (§5.2.4), also those carrying a path parameter (`..;x`, `.;x`),
//!   which Tomcat, Jetty and Spring read as `..` and `.`.
//!
//! - A `%` not followed by two hex digits is refused (RFC 3986 §2.1; nginx answers 400 too):
//!   `/%6%61` would become `/%6a` once `%61` is decoded, which an upstream decoding once
//!   more reads as `/j`.
//!
//! The rule is no change: a path with neither `%` nor `/.` (nor `//` when merged) is returned
//! as None at the cost of a scan or two. Hand-written rather than the `percent-encoding` crate:
//! it decodes every escape, and only the unreserved ones are equivalent.

use std::borrow::Cow;

use proxyfleet_config::{EscapedSlashes, PathRules};

/// Why a request path is refused (answered 400).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("the request path has a % not followed by two hex digits")]
    BadEscape,
    #[error("the request path has an escaped slash or a backslash, which limits.escapedSlashes refuses")]
    EscapedSlash,
}

/// The path normalized under `rules`, when that changes it.
pub fn normalized(path: &str, rules: PathRules) -> Result<Option<String>, PathError> {
    if rules.escaped_slashes == EscapedSlashes::Reject && path.as_bytes().contains(&b'\\') {
        return Err(PathError::EscapedSlash);
    }
    let escaped = path.as_bytes().contains(&b'%');
    let merge = rules.merge_slashes && path.contains("//");
    if !escaped && !merge && !path.contains("/.") {
        return Ok(None);
    }
    let mut p = if escaped {
        decode_escapes(path, rules.escaped_slashes)?
    } else {
        Cow::Borrowed(path)
    };
    if rules.merge_slashes && p.contains("//") {
        p = Cow::Owned(merge_slashes(&p));
    }
    if !p.contains("/.") {
        return Ok(match p {
            Cow::Owned(s) => Some(s),
            Cow::Borrowed(_) => None,
        });
    }
    let out = remove_dot_segments(&p);
    Ok((out != path).then_some(out))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

/// Whether the escaped byte `c` is decoded, under `slashes`; or the path refused.
fn decodes(c: u8, slashes: EscapedSlashes) -> Result<bool, PathError> {
    match (c, slashes) {
        (b'/' | b'\\', EscapedSlashes::Reject) => Err(PathError::EscapedSlash),
        (b'/', EscapedSlashes::Decode) => Ok(true),
        _ => Ok(is_unreserved(c)),
    }
}

/// `%XX` of an unreserved character (and of `/` when `slashes` says so) decoded; every other
/// byte as it is.
fn decode_escapes(path: &str, slashes: EscapedSlashes) -> Result<Cow<'_, str>, PathError> {
    let b = path.as_bytes();
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < b.len() {
        let decoded = match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                let c = h << 4 | l;
                decodes(c, slashes)?.then_some(c)
            }
            (b'%', _, _) => return Err(PathError::BadEscape),
            _ => None,
        };
        match decoded {
            Some(c) => {
                out.get_or_insert_with(|| b[..i].to_vec()).push(c);
                i += 3;
            }
            None => {
                if let Some(o) = out.as_mut() {
                    o.push(b[i]);
                }
                i += 1;
            }
        }
    }
    Ok(match out {
        // Only ASCII was put in place of ASCII escapes: still UTF-8.
        Some(o) => Cow::Owned(String::from_utf8(o).unwrap_or_else(|_| path.to_string())),
        None => Cow::Borrowed(path),
    })
}

/// Runs of `/` as one.
fn merge_slashes(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for c in path.chars() {
        if !(c == '/' && out.ends_with('/')) {
            out.push(c);
        }
    }
    out
}

/// Whether a segment is `.` (false) or `..` (true), a path parameter after it or not.
fn dot_segment(seg: &str) -> Option<bool> {
    let name = seg.split(';').next().unwrap_or(seg);
    match name {
        "." => Some(false),
        ".." => Some(true),
        _ => None,
    }
}

/// RFC 3986 §5.2.4 remove_dot_segments on an absolute path.
fn remove_dot_segments(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    let last = segments.len().saturating_sub(1);
    let mut trailing_slash = false;
    for (i, seg) in segments.iter().enumerate() {
        match dot_segment(seg) {
            Some(up) => {
                if up {
                    out.pop();
                }
                trailing_slash = i == last;
            }
            None => {
                out.push(seg);
                trailing_slash = false;
            }
        }
    }
    let mut s = String::with_capacity(path.len());
    for seg in &out {
        s.push('/');
        s.push_str(seg);
    }
    if trailing_slash || s.is_empty() {
        s.push('/');
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEEP: PathRules = PathRules {
        escaped_slashes: EscapedSlashes::Keep,
        merge_slashes: false,
    };

    fn with(escaped_slashes: EscapedSlashes, merge_slashes: bool) -> PathRules {
        PathRules {
            escaped_slashes,
            merge_slashes,
        }
    }

    #[test]
    fn dot_segments_are_removed() {
        assert_eq!(normalized("/a/b", KEEP), Ok(None));
        assert_eq!(normalized("/api/../admin", KEEP).unwrap().as_deref(), Some("/admin"));
        assert_eq!(
            normalized("/api/%2e%2e/admin", KEEP).unwrap().as_deref(),
            Some("/admin")
        );
        assert_eq!(normalized("/api/%2E./admin", KEEP).unwrap().as_deref(), Some("/admin"));
        assert_eq!(normalized("/a/./b/", KEEP).unwrap().as_deref(), Some("/a/b/"));
        assert_eq!(normalized("/a/b/..", KEEP).unwrap().as_deref(), Some("/a/"));
        assert_eq!(normalized("/../../etc", KEEP).unwrap().as_deref(), Some("/etc"));
        assert_eq!(normalized("/.well-known/x", KEEP), Ok(None), "unchanged");
    }

    #[test]
    fn dot_segments_with_a_path_parameter_are_dot_segments() {
        assert_eq!(normalized("/api/..;/admin", KEEP).unwrap().as_deref(), Some("/admin"));
        assert_eq!(
            normalized("/api/..;jsessionid=1/admin", KEEP).unwrap().as_deref(),
            Some("/admin")
        );
        assert_eq!(normalized("/a/.;x/b", KEEP).unwrap().as_deref(), Some("/a/b"));
        assert_eq!(normalized("/a/..x/b", KEEP), Ok(None));
    }

    fn rules() -> impl proptest::strategy::Strategy<Value = PathRules> {
        use proptest::prelude::*;
        let slashes = prop_oneof![
            Just(EscapedSlashes::Keep),
            Just(EscapedSlashes::Reject),
            Just(EscapedSlashes::Decode)
        ];
        (slashes, any::<bool>()).prop_map(|(s, m)| with(s, m))
    }

    proptest::proptest! {
        /// Normalized once is normalized: what routing matched is what the upstream reads,
        /// whoever normalizes it again; no dot segment is left to climb out of a prefix, and
        /// what the rules take out is out.
        #[test]
        fn normalizing_is_idempotent_and_leaves_no_dot_segment(
            path in "(/([.;aA%2eEfF6]|%2[eEfF5]|%61|%5[cC]|/){0,6}){1,6}",
            rules in rules(),
        ) {
            let escaped_slash = path.to_ascii_lowercase().contains("%2f") || path.to_ascii_lowercase().contains("%5c");
            let first = match normalized(&path, rules) {
                Ok(first) => first,
                Err(PathError::BadEscape) => {
                    proptest::prop_assert!(path.split('%').skip(1).any(|r| !r.chars().take(2).all(|c| c.is_ascii_hexdigit()) || r.len() < 2));
                    return Ok(());
                }
                Err(PathError::EscapedSlash) => {
                    proptest::prop_assert!(escaped_slash && rules.escaped_slashes == EscapedSlashes::Reject);
                    return Ok(());
                }
            };
            let once = first.unwrap_or_else(|| path.clone());
            proptest::prop_assert_eq!(normalized(&once, rules), Ok(None), "{} gave {}", path, once);
            proptest::prop_assert!(once.starts_with('/'));
            for seg in once.split('/') {
                proptest::prop_assert!(dot_segment(seg).is_none(), "{} gave {}", path, once);
            }
            if rules.merge_slashes {
                proptest::prop_assert!(!once.contains("//"), "{} gave {}", path, once);
            }
            if rules.escaped_slashes == EscapedSlashes::Decode {
                proptest::prop_assert!(!once.to_ascii_lowercase().contains("%2f"), "{} gave {}", path, once);
            }
        }
    }

    #[test]
    fn escaped_unreserved_characters_are_decoded_and_others_kept() {
        assert_eq!(normalized("/%61dmin", KEEP).unwrap().as_deref(), Some("/admin"));
        assert_eq!(normalized("/a%7Eb%2d", KEEP).unwrap().as_deref(), Some("/a~b-"));
        assert_eq!(
            normalized("/a%2Fb", KEEP),
            Ok(None),
            "an escaped slash is not a boundary"
        );
        assert_eq!(normalized("/a%2F..%2Fb", KEEP), Ok(None));
        assert_eq!(normalized("/100%25", KEEP), Ok(None));
        assert_eq!(normalized("/bad%zz%4", KEEP), Err(PathError::BadEscape));
        assert_eq!(normalized("/caf%C3%A9", KEEP), Ok(None), "non-ASCII stays escaped");
        assert_eq!(normalized("/%2e%2E/%61", KEEP).unwrap().as_deref(), Some("/a"));
    }

    #[test]
    fn escaped_slashes_are_kept_refused_or_decoded_as_configured() {
        let path = "/api%2F..%2Fadmin";
        assert_eq!(normalized(path, KEEP), Ok(None));
        for p in [path, "/a%5cb", "/a%2fb", "/api\\..\\admin"] {
            assert_eq!(
                normalized(p, with(EscapedSlashes::Reject, false)),
                Err(PathError::EscapedSlash)
            );
        }
        let decode = with(EscapedSlashes::Decode, false);
        assert_eq!(normalized(path, decode).unwrap().as_deref(), Some("/admin"));
        assert_eq!(normalized("/a%2fb", decode).unwrap().as_deref(), Some("/a/b"));
        assert_eq!(normalized("/a%5Cb", decode), Ok(None), "a backslash stays escaped");
        assert_eq!(normalized("/a%252Fb", decode), Ok(None), "%25 is not undone");
    }

    #[test]
    fn slashes_are_merged_when_configured() {
        assert_eq!(normalized("//admin", KEEP), Ok(None));
        let merge = with(EscapedSlashes::Keep, true);
        assert_eq!(normalized("//admin//x/", merge).unwrap().as_deref(), Some("/admin/x/"));
        assert_eq!(
            normalized("/a//../b", merge).unwrap().as_deref(),
            Some("/b"),
            "merged first"
        );
        assert_eq!(normalized("/a/b", merge), Ok(None));
        let both = with(EscapedSlashes::Decode, true);
        assert_eq!(normalized("/a%2F%2fb", both).unwrap().as_deref(), Some("/a/b"));
    }
}
