//! The PROXY protocol v2 header (haproxy.org/download/2.9/doc/proxy-protocol.txt, §2.2) sent to
//! an upstream before the client's bytes, so it sees the client's address. Written by hand: it
//! is 28 or 52 fixed bytes, less code than adapting a crate's builder.

use std::net::SocketAddr;

const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";
/// Version 2, command PROXY.
const V2_PROXY: u8 = 0x21;
const TCP_OVER_IPV4: u8 = 0x11;
const TCP_OVER_IPV6: u8 = 0x21;

/// The header for a connection from `client` to `local` (our listener's address). Mixed
/// families (an IPv4 client on an IPv6 socket) are sent as IPv6, mapped.
pub fn header(client: SocketAddr, local: SocketAddr) -> Vec<u8> {
    let mut out = Vec::with_capacity(52);
    out.extend_from_slice(&SIGNATURE);
    out.push(V2_PROXY);
    match (client, local) {
        (SocketAddr::V4(c), SocketAddr::V4(l)) => {
            out.push(TCP_OVER_IPV4);
            out.extend_from_slice(&12u16.to_be_bytes());
            out.extend_from_slice(&c.ip().octets());
            out.extend_from_slice(&l.ip().octets());
        }
        _ => {
            let v6 = |a: SocketAddr| match a {
                SocketAddr::V4(v4) => v4.ip().to_ipv6_mapped(),
                SocketAddr::V6(v6) => *v6.ip(),
            };
            out.push(TCP_OVER_IPV6);
            out.extend_from_slice(&36u16.to_be_bytes());
            out.extend_from_slice(&v6(client).octets());
            out.extend_from_slice(&v6(local).octets());
        }
    }
    out.extend_from_slice(&client.port().to_be_bytes());
    out.extend_from_slice(&local.port().to_be_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv4_header_is_the_spec_layout() {
        let h = header("192.0.2.7:51000".parse().unwrap(), "10.1.2.3:9443".parse().unwrap());
        assert_eq!(h.len(), 28);
        assert_eq!(&h[..12], b"\r\n\r\n\0\r\nQUIT\n");
        assert_eq!(&h[12..16], &[0x21, 0x11, 0, 12]);
        assert_eq!(&h[16..20], &[192, 0, 2, 7]);
        assert_eq!(&h[20..24], &[10, 1, 2, 3]);
        assert_eq!(&h[24..], &[0xc7, 0x38, 0x24, 0xe3]);
    }

    #[test]
    fn ipv6_and_mixed_families() {
        let h = header(
            "[2001:db8::1]:443".parse().unwrap(),
            "[2001:db8::2]:8443".parse().unwrap(),
        );
        assert_eq!((h.len(), h[13], h[15]), (52, 0x21, 36));
        let mixed = header("192.0.2.7:1".parse().unwrap(), "[::1]:2".parse().unwrap());
        assert_eq!(
            &mixed[16..32],
            &"::ffff:192.0.2.7".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
    }
}
