//! The request path as routing and the upstream see it: RFC 3986 §6.2.2 normalization, so a
//! path that an upstream would read as another cannot pass a route meant for that other one
//! (a route's JWT check, say) by spelling it differently.
//! - Percent-encoded unreserved characters are decoded (`/%61dmin` is `/admin`, `%2e` is `.`).
//!   Other escapes stay as sent: `%2F` is not a segment boundary, and decoding it would change
//!   what the upstream receives.
//! - Dot segments are removed (§5.2.4), also those carrying a path parameter (`..;x`, `.;x`),
//!   which Tomcat, Jetty and Spring read as `..` and `.`.
//!
//! The rule is no change: a path with neither `%` nor `/.` is returned as None at the cost of
//! one scan. Hand-written rather than the `percent-encoding` crate: it decodes every escape,
//! and only the unreserved ones are equivalent.

use std::borrow::Cow;

/// The path normalized, when that changes it.
pub fn normalized(path: &str) -> Option<String> {
    let escaped = path.as_bytes().contains(&b'%');
    if !escaped && !path.contains("/.") {
        return None;
    }
    let decoded = if escaped { decode_unreserved(path) } else { Cow::Borrowed(path) };
    if !decoded.contains("/.") {
        return match decoded {
            Cow::Owned(s) => Some(s),
            Cow::Borrowed(_) => None,
        };
    }
    Some(remove_dot_segments(&decoded))
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn hex(b: u8) -> Option<u8> {
    char::from(b).to_digit(16).map(|d| d as u8)
}

/// `%XX` of an unreserved character decoded; every other byte as it is.
fn decode_unreserved(path: &str) -> Cow<'_, str> {
    let b = path.as_bytes();
    let mut out: Option<Vec<u8>> = None;
    let mut i = 0;
    while i < b.len() {
        let decoded = match (b[i], b.get(i + 1).copied().and_then(hex), b.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) if is_unreserved(h << 4 | l) => Some(h << 4 | l),
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
    match out {
        // Only ASCII was put in place of ASCII escapes: still UTF-8.
        Some(o) => Cow::Owned(String::from_utf8(o).unwrap_or_else(|_| path.to_string())),
        None => Cow::Borrowed(path),
    }
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
        assert_eq!(normalized("/a/b"), None);
        assert_eq!(normalized("/api/../admin").as_deref(), Some("/admin"));
        assert_eq!(normalized("/api/%2e%2e/admin").as_deref(), Some("/admin"));
        assert_eq!(normalized("/api/%2E./admin").as_deref(), Some("/admin"));
        assert_eq!(normalized("/a/./b/").as_deref(), Some("/a/b/"));
        assert_eq!(normalized("/a/b/..").as_deref(), Some("/a/"));
        assert_eq!(normalized("/../../etc").as_deref(), Some("/etc"));
        assert_eq!(normalized("/.well-known/x"), Some("/.well-known/x".to_string()));
    }

    #[test]
    fn dot_segments_with_a_path_parameter_are_dot_segments() {
        assert_eq!(normalized("/api/..;/admin").as_deref(), Some("/admin"));
        assert_eq!(normalized("/api/..;jsessionid=1/admin").as_deref(), Some("/admin"));
        assert_eq!(normalized("/a/.;x/b").as_deref(), Some("/a/b"));
        assert_eq!(normalized("/a/..x/b").as_deref(), Some("/a/..x/b"));
    }

    #[test]
    fn escaped_unreserved_characters_are_decoded_and_others_kept() {
        assert_eq!(normalized("/%61dmin").as_deref(), Some("/admin"));
        assert_eq!(normalized("/a%7Eb%2d").as_deref(), Some("/a~b-"));
        assert_eq!(normalized("/a%2Fb"), None, "an escaped slash is not a boundary");
        assert_eq!(normalized("/a%2F..%2Fb"), None);
        assert_eq!(normalized("/100%25"), None);
        assert_eq!(normalized("/bad%zz%4"), None);
        assert_eq!(normalized("/caf%C3%A9"), None, "non-ASCII stays escaped");
        assert_eq!(normalized("/%2e%2E/%61").as_deref(), Some("/a"));
    }
}
