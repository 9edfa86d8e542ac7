//! HTTP/1.1 on the wire toward an upstream, as pure functions over buffers: the request head
//! we write, the response head we read and how its body is framed (RFC 9112 §6.3), and the
//! chunked decoder. `h1relay` does the I/O around them. Parsing is `httparse`'s (hyper's own
//! parser); header values are slices of the read buffer, not copies.

use bytes::{Buf, Bytes, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING};
use http::{Method, StatusCode};

/// The most response headers we accept (hyper's client default is 100).
const MAX_HEADERS: usize = 128;
/// The longest chunk-size line (size and extensions) we accept.
const MAX_CHUNK_LINE: usize = 4096;
/// The largest trailer section we accept.
const MAX_TRAILERS: usize = 64 * 1024;

/// The upstream broke HTTP/1.1.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    #[error("malformed response head: {0}")]
    Head(httparse::Error),
    #[error("response header {0:?} is invalid")]
    Header(String),
    #[error("response Content-Length is invalid or conflicting")]
    ContentLength,
    #[error("malformed chunked body: {0}")]
    Chunk(&'static str),
    #[error("unexpected 101 Switching Protocols to a request that asked for no upgrade")]
    UnexpectedSwitch,
}

/// How a response's body ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body (HEAD, 204, 304, or Content-Length: 0).
    Empty,
    Length(u64),
    Chunked,
    /// Read until the upstream closes the connection.
    UntilClose,
}

/// A parsed response head.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    /// A reason phrase other than the status code's usual one.
    pub reason: Option<hyper::ext::ReasonPhrase>,
    pub headers: HeaderMap,
    pub framing: Framing,
    /// Whether the connection may carry another request after this response's body.
    pub keep_alive: bool,
}

/// What the bytes read so far hold.
#[derive(Debug)]
pub enum Parsed {
    /// Not a whole head yet: read more.
    Partial,
    /// An interim (1xx) response, taken off the buffer: parse on.
    Interim,
    /// The final response's head, taken off the buffer.
    Final(Head),
}

/// Writes the head of a request whose body is `body_len` bytes into `dst`. `Content-Length` and
/// `Transfer-Encoding` are ours to set (the body is known whole); everything else is written
/// as given (hop-by-hop headers are already gone).
pub fn encode_request(method: &Method, target: &str, headers: &HeaderMap, body_len: u64, dst: &mut Vec<u8>) {
    dst.extend_from_slice(method.as_str().as_bytes());
    dst.push(b' ');
    dst.extend_from_slice(target.as_bytes());
    dst.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in headers {
        if name == CONTENT_LENGTH || name == TRANSFER_ENCODING {
            continue;
        }
        dst.extend_from_slice(name.as_str().as_bytes());
        dst.extend_from_slice(b": ");
        dst.extend_from_slice(value.as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    if body_len > 0 || expects_body(method) {
        dst.extend_from_slice(b"content-length: ");
        dst.extend_from_slice(itoa::Buffer::new().format(body_len).as_bytes());
        dst.extend_from_slice(b"\r\n");
    }
    dst.extend_from_slice(b"\r\n");
}

/// Methods whose requests normally carry a body: an empty one is announced as such.
fn expects_body(method: &Method) -> bool {
    matches!(*method, Method::POST | Method::PUT | Method::PATCH)
}

/// Parses the response head at the start of `buf`, the answer to a `method` request, and
/// takes it off `buf` when it is whole. Header values are slices of the head's bytes, not
/// copies (as hyper's own client does).
pub fn parse_response(buf: &mut BytesMut, method: &Method) -> Result<Parsed, WireError> {
    // Where each header's name and value are, as offsets into the head.
    let mut spans = [(0u32, 0u32, 0u32, 0u32); MAX_HEADERS];
    let (len, code, minor, count, reason) = {
        let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut resp = httparse::Response::new(&mut raw);
        let len = match resp.parse(buf).map_err(WireError::Head)? {
            httparse::Status::Partial => return Ok(Parsed::Partial),
            httparse::Status::Complete(len) => len,
        };
        let base = buf.as_ptr() as usize;
        for (span, h) in spans.iter_mut().zip(resp.headers.iter()) {
            let name = h.name.as_ptr() as usize - base;
            let value = h.value.as_ptr() as usize - base;
            *span = (name as u32, h.name.len() as u32, value as u32, h.value.len() as u32);
        }
        let code = resp.code.unwrap_or(0);
        let reason = own_reason(code, resp.reason);
        (len, code, resp.version, resp.headers.len(), reason)
    };
    let head = buf.split_to(len).freeze();
    let status = StatusCode::from_u16(code).map_err(|_| WireError::Head(httparse::Error::Status))?;
    if code == 101 {
        return Err(WireError::UnexpectedSwitch);
    }
    if status.is_informational() {
        return Ok(Parsed::Interim);
    }
    let version = if minor == Some(0) {
        http::Version::HTTP_10
    } else {
        http::Version::HTTP_11
    };
    let mut headers = HeaderMap::with_capacity(count);
    for &(ns, nl, vs, vl) in &spans[..count] {
        let raw_name = &head[ns as usize..(ns + nl) as usize];
        let bad = || WireError::Header(String::from_utf8_lossy(raw_name).into_owned());
        let name = HeaderName::from_bytes(raw_name).map_err(|_| bad())?;
        let value = HeaderValue::from_maybe_shared(head.slice(vs as usize..(vs + vl) as usize)).map_err(|_| bad())?;
        headers.append(name, value);
    }
    let (framing, clean) = framing(method, status, &headers)?;
    if !clean {
        // Beside Transfer-Encoding (which frames the body), or on a 204, a Content-Length is
        // not the body's and must not reach the client (RFC 9112 §6.3).
        headers.remove(CONTENT_LENGTH);
    }
    // HTTP/1.0 has no Transfer-Encoding: a response with one is read, then its connection
    // closed (RFC 9112 §6.1).
    let te_in_10 = version == http::Version::HTTP_10 && headers.contains_key(TRANSFER_ENCODING);
    let keep_alive = clean && !te_in_10 && keeps_alive(version, &headers) && framing != Framing::UntilClose;
    Ok(Parsed::Final(Head {
        status,
        reason,
        headers,
        framing,
        keep_alive,
    }))
}

/// A reason phrase other than the status code's usual one, to pass on to HTTP/1.1 clients as
/// hyper's client did (`hyper::ext::ReasonPhrase`).
fn own_reason(code: u16, reason: Option<&str>) -> Option<hyper::ext::ReasonPhrase> {
    let reason = reason.filter(|r| !r.is_empty())?;
    let usual = StatusCode::from_u16(code).ok().and_then(|s| s.canonical_reason());
    if usual == Some(reason) {
        return None;
    }
    hyper::ext::ReasonPhrase::try_from(reason.as_bytes()).ok()
}

/// How the body is framed (RFC 9112 §6.3), and whether the framing was unambiguous (a response
/// with both Transfer-Encoding and Content-Length is read as chunked, then the connection closed).
fn framing(method: &Method, status: StatusCode, headers: &HeaderMap) -> Result<(Framing, bool), WireError> {
    if status == StatusCode::NO_CONTENT {
        // A 204 announcing a body (which it must not, RFC 9110 §8.6) may send one: its
        // connection is not used again, so no such bytes become the next answer.
        let announces =
            headers.contains_key(TRANSFER_ENCODING) || content_length(headers).map_or(true, |n| n.unwrap_or(0) > 0);
        return Ok((Framing::Empty, !announces));
    }
    if *method == Method::HEAD || status == StatusCode::NOT_MODIFIED {
        return Ok((Framing::Empty, true));
    }
    if headers.contains_key(TRANSFER_ENCODING) {
        let chunked_last = headers
            .get_all(TRANSFER_ENCODING)
            .iter()
            .next_back()
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.rsplit(',').next())
            .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
        let clean = !headers.contains_key(CONTENT_LENGTH);
        return Ok(if chunked_last {
            (Framing::Chunked, clean)
        } else {
            (Framing::UntilClose, false)
        });
    }
    match content_length(headers)? {
        Some(0) => Ok((Framing::Empty, true)),
        Some(n) => Ok((Framing::Length(n), true)),
        None => Ok((Framing::UntilClose, true)),
    }
}

/// The Content-Length: every value (and every element of a list) the same number.
fn content_length(headers: &HeaderMap) -> Result<Option<u64>, WireError> {
    let mut found = None;
    for v in headers.get_all(CONTENT_LENGTH) {
        let s = v.to_str().map_err(|_| WireError::ContentLength)?;
        for part in s.split(',') {
            let part = part.trim();
            if part.is_empty() || part.len() > 19 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(WireError::ContentLength);
            }
            let n: u64 = part.parse().map_err(|_| WireError::ContentLength)?;
            if found.is_some_and(|f| f != n) {
                return Err(WireError::ContentLength);
            }
            found = Some(n);
        }
    }
    Ok(found)
}

/// HTTP/1.1 keeps the connection unless told `close`; HTTP/1.0 only when told `keep-alive`.
fn keeps_alive(version: http::Version, headers: &HeaderMap) -> bool {
    if crate::forwarding::header_has_token(headers, &CONNECTION, "close") {
        return false;
    }
    version == http::Version::HTTP_11 || crate::forwarding::header_has_token(headers, &CONNECTION, "keep-alive")
}

/// What the chunked decoder found.
#[derive(Debug, PartialEq)]
pub enum Chunk {
    Data(Bytes),
    /// The last chunk and its trailers (possibly none): the body is complete.
    End(Option<HeaderMap>),
}

/// Where the chunked decoder is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkedState {
    /// At a chunk-size line.
    Size,
    /// Inside a chunk's data, this much left.
    Data(u64),
    /// After a chunk's data, at its CRLF.
    DataEnd,
    /// After the last chunk: trailers, then an empty line.
    Trailers,
    Done,
}

impl ChunkedState {
    /// Decodes what it can from the front of `buf`; `Ok(None)` when it needs more bytes.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Chunk>, WireError> {
        loop {
            match *self {
                ChunkedState::Size => {
                    let Some(size) = chunk_size(buf)? else {
                        return Ok(None);
                    };
                    *self = if size == 0 {
                        ChunkedState::Trailers
                    } else {
                        ChunkedState::Data(size)
                    };
                }
                ChunkedState::Data(left) => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    let n = (buf.len() as u64).min(left) as usize;
                    *self = if left == n as u64 {
                        ChunkedState::DataEnd
                    } else {
                        ChunkedState::Data(left - n as u64)
                    };
                    return Ok(Some(Chunk::Data(buf.split_to(n).freeze())));
                }
                ChunkedState::DataEnd => {
                    let Some(ended) = line_end(buf, 0) else {
                        return Ok(None);
                    };
                    if ended == 0 {
                        return Err(WireError::Chunk("chunk data not followed by CRLF"));
                    }
                    buf.advance(ended);
                    *self = ChunkedState::Size;
                }
                ChunkedState::Trailers => {
                    let Some(trailers) = trailers(buf)? else {
                        return Ok(None);
                    };
                    *self = ChunkedState::Done;
                    return Ok(Some(Chunk::End(trailers)));
                }
                ChunkedState::Done => return Ok(Some(Chunk::End(None))),
            }
        }
    }
}

/// A line break at `at`: Some(its length) when there is one (CRLF, or a bare LF as nginx
/// accepts), Some(0) when another byte is there, None when `buf` ends first.
fn line_end(buf: &[u8], at: usize) -> Option<usize> {
    match buf.get(at..) {
        Some([b'\r', b'\n', ..]) => Some(2),
        Some([b'\n', ..]) => Some(1),
        Some([b'\r']) | Some([]) | None => None,
        Some(_) => Some(0),
    }
}

/// Parses and consumes a chunk-size line (`1a;ext=1\r\n`); None when it is not all there yet.
fn chunk_size(buf: &mut BytesMut) -> Result<Option<u64>, WireError> {
    let Some(nl) = buf.iter().take(MAX_CHUNK_LINE).position(|&b| b == b'\n') else {
        if buf.len() >= MAX_CHUNK_LINE {
            return Err(WireError::Chunk("chunk-size line too long"));
        }
        return Ok(None);
    };
    let line = &buf[..nl];
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 || digits > 16 {
        return Err(WireError::Chunk("invalid chunk size"));
    }
    let rest = &line[digits..];
    let rest_ok = rest.iter().all(|&b| b == b' ' || b == b'\t')
        || matches!(rest.iter().find(|&&b| b != b' ' && b != b'\t'), Some(b';'));
    if !rest_ok || line.contains(&b'\r') {
        return Err(WireError::Chunk("invalid chunk-size line"));
    }
    let mut size: u64 = 0;
    for &b in &line[..digits] {
        let d = (b as char).to_digit(16).unwrap_or(0) as u64;
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(d))
            .ok_or(WireError::Chunk("chunk size overflows"))?;
    }
    buf.advance(nl + 1);
    Ok(Some(size))
}

/// Parses and consumes the trailer section after the last chunk; None when not all there.
fn trailers(buf: &mut BytesMut) -> Result<Option<Option<HeaderMap>>, WireError> {
    if let Some(n) = line_end(buf, 0) {
        if n > 0 {
            buf.advance(n);
            return Ok(Some(None));
        }
    } else {
        return Ok(None);
    }
    let mut raw = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let (len, parsed) = match httparse::parse_headers(buf, &mut raw).map_err(WireError::Head)? {
        httparse::Status::Partial if buf.len() >= MAX_TRAILERS => return Err(WireError::Chunk("trailers too large")),
        httparse::Status::Partial => return Ok(None),
        httparse::Status::Complete((len, parsed)) => (len, parsed),
    };
    let mut map = HeaderMap::with_capacity(parsed.len());
    for h in parsed.iter() {
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| WireError::Header(h.name.to_string()))?;
        let value = HeaderValue::from_bytes(h.value).map_err(|_| WireError::Header(h.name.to_string()))?;
        map.append(name, value);
    }
    buf.advance(len);
    Ok(Some(Some(map)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(raw: &[u8], method: &Method) -> Result<Parsed, WireError> {
        parse_response(&mut BytesMut::from(raw), method)
    }

    fn head(raw: &str, method: Method) -> Head {
        match parse(raw.as_bytes(), &method).expect("parses") {
            Parsed::Final(head) => head,
            other => panic!("not a final head: {other:?}"),
        }
    }

    #[test]
    fn a_request_head_sets_its_own_length_and_drops_transfer_encoding() {
        let mut h = HeaderMap::new();
        h.insert("host", HeaderValue::from_static("a"));
        h.insert(CONTENT_LENGTH, HeaderValue::from_static("99"));
        h.insert(TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        let mut out = Vec::new();
        encode_request(&Method::POST, "/x?y=1", &h, 3, &mut out);
        assert_eq!(out, b"POST /x?y=1 HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\n");
        out.clear();
        encode_request(&Method::GET, "/", &h, 0, &mut out);
        assert_eq!(out, b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
        out.clear();
        encode_request(&Method::PUT, "/", &HeaderMap::new(), 0, &mut out);
        assert_eq!(out, b"PUT / HTTP/1.1\r\ncontent-length: 0\r\n\r\n");
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let ok = "HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n";
        assert_eq!(head(ok, Method::GET).framing, Framing::Length(5));
        assert_eq!(head(ok, Method::HEAD).framing, Framing::Empty);
        assert_eq!(
            head("HTTP/1.1 204 No Content\r\n\r\n", Method::GET).framing,
            Framing::Empty
        );
        assert_eq!(
            head("HTTP/1.1 304 x\r\ncontent-length: 9\r\n\r\n", Method::GET).framing,
            Framing::Empty
        );
        let odd = head("HTTP/1.1 204 x\r\ncontent-length: 9\r\n\r\n", Method::GET);
        assert_eq!(
            (odd.framing, odd.keep_alive),
            (Framing::Empty, false),
            "a 204 announcing a body"
        );
        let plain = head("HTTP/1.1 204 x\r\ncontent-length: 0\r\n\r\n", Method::GET);
        assert_eq!((plain.framing, plain.keep_alive), (Framing::Empty, true));
        let chunked = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            Method::GET,
        );
        assert_eq!((chunked.framing, chunked.keep_alive), (Framing::Chunked, true));
        let both = head(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            Method::GET,
        );
        assert_eq!((both.framing, both.keep_alive), (Framing::Chunked, false));
        assert!(
            !both.headers.contains_key(CONTENT_LENGTH),
            "the length beside chunked is dropped"
        );
        let gzip = head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n", Method::GET);
        assert_eq!((gzip.framing, gzip.keep_alive), (Framing::UntilClose, false));
        let none = head("HTTP/1.1 200 OK\r\n\r\n", Method::GET);
        assert_eq!((none.framing, none.keep_alive), (Framing::UntilClose, false));
        assert_eq!(
            head("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", Method::GET).framing,
            Framing::Empty
        );
    }

    #[test]
    fn content_lengths_must_agree() {
        let same = "HTTP/1.1 200 OK\r\ncontent-length: 4, 4\r\ncontent-length: 4\r\n\r\n";
        assert_eq!(head(same, Method::GET).framing, Framing::Length(4));
        for bad in ["4, 5", "-1", "+4", "0x4", "", "99999999999999999999"] {
            let raw = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert_eq!(
                parse(raw.as_bytes(), &Method::GET).err(),
                Some(WireError::ContentLength),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn keep_alive_by_version_and_connection() {
        let h = |raw: &str| head(raw, Method::GET).keep_alive;
        assert!(h("HTTP/1.1 200 OK\r\ncontent-length: 1\r\n\r\n"));
        assert!(!h("HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 1\r\n\r\n"));
        assert!(!h("HTTP/1.0 200 OK\r\ncontent-length: 1\r\n\r\n"));
        assert!(h(
            "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 1\r\n\r\n"
        ));
        let te_in_10 = "HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n";
        assert!(!h(te_in_10), "HTTP/1.0 has no Transfer-Encoding: close after it");
    }

    #[test]
    fn only_an_unusual_reason_phrase_is_kept() {
        assert!(head("HTTP/1.1 200 OK\r\n\r\n", Method::HEAD).reason.is_none());
        assert!(head("HTTP/1.1 200 \r\n\r\n", Method::HEAD).reason.is_none());
        let own = head("HTTP/1.1 200 Fine Thanks\r\n\r\n", Method::HEAD)
            .reason
            .expect("kept");
        assert_eq!(own.as_bytes(), b"Fine Thanks");
    }

    #[test]
    fn partial_interim_and_switching_heads() {
        assert!(matches!(
            parse(b"HTTP/1.1 200 OK\r\n", &Method::GET),
            Ok(Parsed::Partial)
        ));
        let interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n";
        assert!(matches!(parse(interim, &Method::GET), Ok(Parsed::Interim)));
        assert_eq!(
            parse(b"HTTP/1.1 101 Switching\r\n\r\n", &Method::GET).err(),
            Some(WireError::UnexpectedSwitch)
        );
        assert!(parse(b"HTTP/2 200\r\n\r\n", &Method::GET).is_err());
        let mut two = BytesMut::from(&b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nx-a: b\r\n\r\nrest"[..]);
        assert!(matches!(parse_response(&mut two, &Method::GET), Ok(Parsed::Interim)));
        let Ok(Parsed::Final(h)) = parse_response(&mut two, &Method::GET) else {
            panic!("no final head")
        };
        assert_eq!((h.headers["x-a"].as_bytes(), &two[..]), (&b"b"[..], &b"rest"[..]));
    }

    fn decode_all(input: &[u8], step: usize) -> Result<(Vec<u8>, Option<HeaderMap>), WireError> {
        let mut state = ChunkedState::Size;
        let mut buf = BytesMut::new();
        let mut body = Vec::new();
        let mut fed = 0;
        loop {
            match state.decode(&mut buf)? {
                Some(Chunk::Data(d)) => body.extend_from_slice(&d),
                Some(Chunk::End(t)) => return Ok((body, t)),
                None if fed < input.len() => {
                    let end = (fed + step).min(input.len());
                    buf.extend_from_slice(&input[fed..end]);
                    fed = end;
                }
                None => return Err(WireError::Chunk("ran out")),
            }
        }
    }

    #[test]
    fn chunked_bodies_decode_whatever_the_read_sizes() {
        let input = b"5\r\nhello\r\n1a;name=v\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-t: 1\r\n\r\n";
        for step in [1, 2, 3, 7, 64] {
            let (body, trailers) = decode_all(input, step).expect("decodes");
            assert_eq!(body, b"helloabcdefghijklmnopqrstuvwxyz");
            assert_eq!(trailers.expect("trailers")["x-t"], "1");
        }
        let (body, trailers) = decode_all(b"3\nabc\n0\n\n", 1).expect("bare LF");
        assert_eq!((body.as_slice(), trailers), (&b"abc"[..], None));
    }

    #[test]
    fn malformed_chunked_bodies_are_errors() {
        for bad in [
            &b"g\r\n"[..],
            b"5\r\nhelloX\r\n",
            b"5 x\r\nhello\r\n",
            b"11111111111111111\r\n",
            b"5\r\r\nhello\r\n",
        ] {
            let r = decode_all(bad, 64);
            assert!(r.is_err(), "{:?} gave {r:?}", String::from_utf8_lossy(bad));
        }
        let long = vec![b'1'; MAX_CHUNK_LINE + 1];
        assert!(decode_all(&long, 8192).is_err());
    }
}
