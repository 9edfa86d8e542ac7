//! The SOCKS5 handshake as pure parsing over the bytes received so far (RFC 1928, with the
//! username/password sub-negotiation of RFC 1929): each parser says it needs more bytes, has a
//! message (and how many bytes it took), or the bytes are not SOCKS5. No I/O here, so the
//! fuzzer can drive it.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

/// A parse over a prefix of the received bytes.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed<T> {
    NeedMore,
    /// The message and the number of bytes it used.
    Done(T, usize),
    Invalid(Invalid),
}

/// Why the bytes are not a SOCKS5 message; `reply` is the code to answer with, where the
/// protocol has one for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Invalid {
    /// Not version 5 (or 1 in the password sub-negotiation).
    Version,
    /// The greeting offers no methods.
    NoMethods,
    /// A request with an address type other than IPv4, domain name or IPv6.
    AddressType,
    /// A domain name that is empty or not text.
    DomainName,
    /// The reserved byte is not zero.
    Reserved,
}

impl Invalid {
    /// The reply code for a request refused for this reason (RFC 1928 §6).
    pub fn reply(self) -> Reply {
        match self {
            Invalid::AddressType => Reply::AddressTypeNotSupported,
            _ => Reply::GeneralFailure,
        }
    }
}

/// Authentication methods (RFC 1928 §3).
pub const METHOD_NONE: u8 = 0x00;
pub const METHOD_PASSWORD: u8 = 0x02;
pub const METHOD_UNACCEPTABLE: u8 = 0xff;

/// Which methods a greeting offers that we speak.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offered {
    pub none: bool,
    pub password: bool,
}

/// The client's greeting: `VER NMETHODS METHODS...`.
pub fn greeting(buf: &[u8]) -> Parsed<Offered> {
    let [version, n, ..] = buf else {
        return Parsed::NeedMore;
    };
    if *version != 5 {
        return Parsed::Invalid(Invalid::Version);
    }
    let n = usize::from(*n);
    if n == 0 {
        return Parsed::Invalid(Invalid::NoMethods);
    }
    let Some(methods) = buf.get(2..2 + n) else {
        return Parsed::NeedMore;
    };
    let offered = Offered {
        none: methods.contains(&METHOD_NONE),
        password: methods.contains(&METHOD_PASSWORD),
    };
    Parsed::Done(offered, 2 + n)
}

/// The method the server picks: password when it has credentials (and then only that),
/// otherwise no authentication.
pub fn choose_method(offered: Offered, password_required: bool) -> u8 {
    match (password_required, offered.password, offered.none) {
        (true, true, _) => METHOD_PASSWORD,
        (false, _, true) => METHOD_NONE,
        _ => METHOD_UNACCEPTABLE,
    }
}

/// RFC 1929 username and password, as sent (bytes: neither needs to be UTF-8).
#[derive(Debug, PartialEq, Eq)]
pub struct Credentials {
    pub username: Vec<u8>,
    pub password: Vec<u8>,
}

/// The sub-negotiation: `VER=1 ULEN UNAME PLEN PASSWD`.
pub fn credentials(buf: &[u8]) -> Parsed<Credentials> {
    let [version, ulen, ..] = buf else {
        return Parsed::NeedMore;
    };
    if *version != 1 {
        return Parsed::Invalid(Invalid::Version);
    }
    let uend = 2 + usize::from(*ulen);
    let Some(&plen) = buf.get(uend) else {
        return Parsed::NeedMore;
    };
    let pend = uend + 1 + usize::from(plen);
    if buf.len() < pend {
        return Parsed::NeedMore;
    }
    let c = Credentials {
        username: buf[2..uend].to_vec(),
        password: buf[uend + 1..pend].to_vec(),
    };
    Parsed::Done(c, pend)
}

/// Commands (RFC 1928 §4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Connect,
    Bind,
    UdpAssociate,
    Other(u8),
}

/// Where the client asks to go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Address(SocketAddr),
    Domain(String, u16),
}

impl Target {
    /// `host:port` as the CONNECT allow-list matches it (`[v6]:port` for IPv6).
    pub fn authority(&self) -> String {
        match self {
            Target::Address(a) => a.to_string(),
            Target::Domain(host, port) => format!("{host}:{port}"),
        }
    }
}

/// A request: `VER CMD RSV ATYP DST.ADDR DST.PORT`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub command: Command,
    pub target: Target,
}

/// Parses a request.
pub fn request(buf: &[u8]) -> Parsed<Request> {
    let [version, command, reserved, atyp, rest @ ..] = buf else {
        return Parsed::NeedMore;
    };
    if *version != 5 {
        return Parsed::Invalid(Invalid::Version);
    }
    if *reserved != 0 {
        return Parsed::Invalid(Invalid::Reserved);
    }
    let command = match command {
        1 => Command::Connect,
        2 => Command::Bind,
        3 => Command::UdpAssociate,
        c => Command::Other(*c),
    };
    let (target, used) = match address(*atyp, rest) {
        Parsed::Done(t, n) => (t, n),
        Parsed::NeedMore => return Parsed::NeedMore,
        Parsed::Invalid(i) => return Parsed::Invalid(i),
    };
    Parsed::Done(Request { command, target }, 4 + used)
}

/// `DST.ADDR DST.PORT` for one address type.
fn address(atyp: u8, rest: &[u8]) -> Parsed<Target> {
    let port_at = |at: usize| rest.get(at..at + 2).map(|p| u16::from_be_bytes([p[0], p[1]]));
    match atyp {
        1 => {
            let (Some(ip), Some(port)) = (rest.get(..4), port_at(4)) else {
                return Parsed::NeedMore;
            };
            let ip = Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]);
            Parsed::Done(Target::Address(SocketAddr::from((ip, port))), 6)
        }
        4 => {
            let (Some(ip), Some(port)) = (rest.get(..16), port_at(16)) else {
                return Parsed::NeedMore;
            };
            let mut octets = [0u8; 16];
            octets.copy_from_slice(ip);
            Parsed::Done(Target::Address(SocketAddr::from((Ipv6Addr::from(octets), port))), 18)
        }
        3 => {
            let Some(&len) = rest.first() else {
                return Parsed::NeedMore;
            };
            let len = usize::from(len);
            let (Some(name), Some(port)) = (rest.get(1..1 + len), port_at(1 + len)) else {
                return Parsed::NeedMore;
            };
            match std::str::from_utf8(name) {
                Ok(n) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_graphic()) => {
                    Parsed::Done(Target::Domain(n.to_ascii_lowercase(), port), 1 + len + 2)
                }
                _ => Parsed::Invalid(Invalid::DomainName),
            }
        }
        _ => Parsed::Invalid(Invalid::AddressType),
    }
}

/// Reply codes (RFC 1928 §6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Reply {
    Succeeded = 0,
    GeneralFailure = 1,
    NotAllowed = 2,
    NetworkUnreachable = 3,
    HostUnreachable = 4,
    ConnectionRefused = 5,
    TtlExpired = 6,
    CommandNotSupported = 7,
    AddressTypeNotSupported = 8,
}

/// A reply: `VER REP RSV ATYP BND.ADDR BND.PORT`, with the bound address when there is one
/// (0.0.0.0:0 otherwise, as clients ignore it for refusals).
pub fn reply(code: Reply, bound: Option<SocketAddr>) -> Vec<u8> {
    let mut out = vec![5, code as u8, 0];
    match bound.unwrap_or_else(|| SocketAddr::from(([0, 0, 0, 0], 0))) {
        SocketAddr::V4(a) => {
            out.push(1);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
        SocketAddr::V6(a) => {
            out.push(4);
            out.extend_from_slice(&a.ip().octets());
            out.extend_from_slice(&a.port().to_be_bytes());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greetings_need_all_their_methods() {
        assert_eq!(greeting(&[5]), Parsed::NeedMore);
        assert_eq!(greeting(&[5, 2, 0]), Parsed::NeedMore);
        assert_eq!(
            greeting(&[5, 2, 0, 2, 9]),
            Parsed::Done(
                Offered {
                    none: true,
                    password: true
                },
                4
            )
        );
        assert_eq!(greeting(&[4, 1, 0]), Parsed::Invalid(Invalid::Version));
        assert_eq!(greeting(&[5, 0]), Parsed::Invalid(Invalid::NoMethods));
    }

    #[test]
    fn password_is_the_only_method_when_required() {
        let both = Offered {
            none: true,
            password: true,
        };
        let none_only = Offered {
            none: true,
            password: false,
        };
        assert_eq!(choose_method(both, true), METHOD_PASSWORD);
        assert_eq!(choose_method(none_only, true), METHOD_UNACCEPTABLE);
        assert_eq!(choose_method(both, false), METHOD_NONE);
        assert_eq!(
            choose_method(
                Offered {
                    none: false,
                    password: true
                },
                false
            ),
            METHOD_UNACCEPTABLE
        );
    }

    #[test]
    fn credentials_are_length_prefixed() {
        let msg = [1, 3, b'b', b'o', b'b', 2, b'p', b'w', 0xaa];
        assert_eq!(
            credentials(&msg),
            Parsed::Done(
                Credentials {
                    username: b"bob".to_vec(),
                    password: b"pw".to_vec()
                },
                8
            )
        );
        for cut in 0..8 {
            assert_eq!(credentials(&msg[..cut]), Parsed::NeedMore, "{cut}");
        }
        assert_eq!(credentials(&[5, 0, 0]), Parsed::Invalid(Invalid::Version));
    }

    #[test]
    fn requests_for_each_address_type() {
        let v4 = [5, 1, 0, 1, 10, 0, 0, 1, 0x01, 0xbb];
        let want = Request {
            command: Command::Connect,
            target: Target::Address("10.0.0.1:443".parse().unwrap()),
        };
        assert_eq!(request(&v4), Parsed::Done(want.clone(), 10));
        for cut in 0..10 {
            assert_eq!(request(&v4[..cut]), Parsed::NeedMore, "{cut}");
        }
        let mut v6 = vec![5, 3, 0, 4];
        v6.extend_from_slice(&"::1".parse::<Ipv6Addr>().unwrap().octets());
        v6.extend_from_slice(&[0, 80]);
        let Parsed::Done(r, 22) = request(&v6) else { panic!() };
        assert_eq!(r.command, Command::UdpAssociate);
        assert_eq!(r.target.authority(), "[::1]:80");
        let name = [5, 1, 0, 3, 7, b'E', b'x', b'.', b'c', b'o', b'm', b'!', 0, 80];
        let Parsed::Done(r, 14) = request(&name) else { panic!() };
        assert_eq!(r.target, Target::Domain("ex.com!".into(), 80));
        assert_eq!(request(&[5, 1, 0, 3, 0, 0, 80]), Parsed::Invalid(Invalid::DomainName));
        assert_eq!(
            request(&[5, 1, 0, 3, 1, b' ', 0, 80]),
            Parsed::Invalid(Invalid::DomainName)
        );
        assert_eq!(request(&[5, 1, 0, 9, 0]), Parsed::Invalid(Invalid::AddressType));
        assert_eq!(Invalid::AddressType.reply(), Reply::AddressTypeNotSupported);
        assert_eq!(request(&[5, 1, 1, 1]), Parsed::Invalid(Invalid::Reserved));
        assert!(request(&[5, 9, 0, 1, 1, 2, 3, 4, 0, 1]).is_done_with(Command::Other(9)));
    }

    impl Parsed<Request> {
        fn is_done_with(&self, c: Command) -> bool {
            matches!(self, Parsed::Done(r, _) if r.command == c)
        }
    }

    #[test]
    fn replies_carry_the_bound_address() {
        assert_eq!(reply(Reply::NotAllowed, None), vec![5, 2, 0, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            reply(Reply::Succeeded, Some("10.1.2.3:4096".parse().unwrap())),
            vec![5, 0, 0, 1, 10, 1, 2, 3, 16, 0]
        );
        assert_eq!(reply(Reply::Succeeded, Some("[::1]:1".parse().unwrap())).len(), 22);
    }
}
