//! The SOCKS5 handshake parsers (greeting, RFC 1929 credentials, request): any bytes give
//! NeedMore, a message or Invalid and never panic; a message never uses more bytes than it was
//! given; every shorter prefix of a message is NeedMore (no message is decided early), and a
//! prefix of an invalid message is NeedMore or invalid for the same reason. A request's
//! authority is always one the CONNECT allow-list can read (`host:port`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxyfleet_proxy::socks5::handshake::{credentials, greeting, reply, request, Parsed, Reply};

fn check<T: PartialEq + std::fmt::Debug>(bytes: &[u8], parse: fn(&[u8]) -> Parsed<T>) -> Option<usize> {
    let whole = parse(bytes);
    match &whole {
        Parsed::Done(_, used) => {
            assert!(*used <= bytes.len() && *used > 0);
            for k in 0..*used {
                assert_eq!(parse(&bytes[..k]), Parsed::NeedMore, "decided after {k} of {used} bytes");
            }
            assert_eq!(parse(&bytes[..*used]), whole, "the message depends on bytes after it");
            Some(*used)
        }
        Parsed::Invalid(why) => {
            for k in 0..bytes.len() {
                let p = parse(&bytes[..k]);
                assert!(p == Parsed::NeedMore || p == Parsed::Invalid(*why), "{p:?} then {why:?}");
            }
            None
        }
        Parsed::NeedMore => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = check(data, greeting);
    let _ = check(data, credentials);
    if check(data, request).is_some() {
        if let Parsed::Done(r, _) = request(data) {
            let a = r.target.authority();
            let (host, port) = a.rsplit_once(':').expect("host:port");
            assert!(!host.is_empty() && port.parse::<u16>().is_ok(), "{a}");
            let _ = reply(Reply::Succeeded, None);
        }
    }
});
