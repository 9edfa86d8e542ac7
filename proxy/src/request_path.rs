//! The request path as routing and the upstream see it: RFC 3986 §6.2.2 normalization, so a
//! path that an upstream would read as another cannot pass a route meant for that other one
//! (a route's JWT check, say) by spelling it differently.
//! - Percent-encoded unreserved characters are decoded (`/%61dmin` is `/admin`, `%2e` is `.`).
//!   Other escapes stay as sent: `%2F` is not a segment boundary, and decoding it would change
//!   what the upstream receives.
//! - Dot segments are removed (§5.2.4), also those carrying a path parameter (`..;x`, `.;x`),
//!   which Tomcat, Jetty and Spring read as `..` and `.`.
//!
//! - A `%` not followed by two hex digits is refused (RFC 3986 §2.1; nginx answers 400 too):
//!   `/%6%61` would become `/%6a` once `%61` is decoded, which an upstream decoding once
//!   more reads as `/j`.
//!
//! The rule is no change: a path with neither `%` nor `/.` is returned as None at the cost of
//! one scan. Hand-written rather than the `percent-encoding` crate: it decodes every escape,
//! and only the unreserved ones are equivalent.

use std::borrow::Cow;

/// A `%` in the path not followed by two hex digits.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("the request path has a % not followed by two hex digits")]
pub struct BadEscape;

/// The path normalized, when that changes it.
pub fn normalized(path: &str) -> Result<Option<String>, BadEscape> {
    let escaped = path.as_bytes().contains(&b'%');
    if !escaped && !path.contains("/.") {
        return Ok(None);
    }
    let decoded = if escaped {
        decode_unreserved(path)?
    } else {
        Cow::Borrowed(path)
    };
    if !decoded.contains("/.") {
        return Ok(match decoded {
            Cow::Owned(s) => Some(s),
            Cow::Borrowed(_) => None,
        });
    }
    let out = remove_dot_segments(&decoded);
    Ok((out != path).then_some(out))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

/// `%XX` of an unreserved character decoded; every other byte as it is.
fn decode_unreserved(path: &str) -> Result<Cow<'_, str>, BadEscape> {
    let b = path.as_bytes();
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < b.len() {
        let decoded = match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => Some(h << 4 | l).filter(|c| is_unreserved(*c)),
            (b'%', _, _) => return Err(BadEscape),
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

    #[test]
    fn dot_segments_are_removed() {
        assert_eq!(normalized("/a/b"), Ok(None));
        assert_eq!(normalized("/api/../admin").unwrap().as_deref(), Some("/admin"));
        assert_eq!(normalized("/api/%2e%2e/admin").unwrap().as_deref(), Some("/admin"));
        assert_eq!(normalized("/api/%2E./admin").unwrap().as_deref(), Some("/admin"));
        assert_eq!(normalized("/a/./b/").unwrap().as_deref(), Some("/a/b/"));
        assert_eq!(normalized("/a/b/..").unwrap().as_deref(), Some("/a/"));
        assert_eq!(normalized("/../../etc").unwrap().as_deref(), Some("/etc"));
        assert_eq!(normalized("/.well-known/x"), Ok(None), "unchanged");
    }

    #[test]
    fn dot_segments_with_a_path_parameter_are_dot_segments() {
        assert_eq!(normalized("/api/..;/admin").unwrap().as_deref(), Some("/admin"));
        assert_eq!(
            normalized("/api/..;jsessionid=1/admin").unwrap().as_deref(),
            Some("/admin")
        );
        assert_eq!(normalized("/a/.;x/b").unwrap().as_deref(), Some("/a/b"));
        assert_eq!(normalized("/a/..x/b"), Ok(None));
    }

    proptest::proptest! {
        /// Normalized once is normalized: what routing matched is what the upstream reads,
        /// whoever normalizes it again; and no dot segment is left to climb out of a prefix.
        #[test]
        fn normalizing_is_idempotent_and_leaves_no_dot_segment(
            path in "(/([.;aA%2eEfF6]|%2[eEfF5]|%61){0,6}){1,6}"
        ) {
            let Ok(first) = normalized(&path) else {
                // Refused: a % without two hex digits after it.
                proptest::prop_assert!(path.split('%').skip(1).any(|r| !r.chars().take(2).all(|c| c.is_ascii_hexdigit()) || r.len() < 2));
                return Ok(());
            };
            let once = first.unwrap_or_else(|| path.clone());
            proptest::prop_assert_eq!(normalized(&once), Ok(None), "{} gave {}", path, once);
            proptest::prop_assert!(once.starts_with('/'));
            for seg in once.split('/') {
                proptest::prop_assert!(dot_segment(seg).is_none(), "{} gave {}", path, once);
            }
        }
    }

    #[test]
    fn escaped_unreserved_characters_are_decoded_and_others_kept() {
        assert_eq!(normalized("/%61dmin").unwrap().as_deref(), Some("/admin"));
        assert_eq!(normalized("/a%7Eb%2d").unwrap().as_deref(), Some("/a~b-"));
        assert_eq!(normalized("/a%2Fb"), Ok(None), "an escaped slash is not a boundary");
        assert_eq!(normalized("/a%2F..%2Fb"), Ok(None));
        assert_eq!(normalized("/100%25"), Ok(None));
        assert_eq!(normalized("/bad%zz%4"), Err(BadEscape));
        assert_eq!(normalized("/caf%C3%A9"), Ok(None), "non-ASCII stays escaped");
        assert_eq!(normalized("/%2e%2E/%61").unwrap().as_deref(), Some("/a"));
    }
}
