//! Where a tunnel (HTTP CONNECT, SOCKS5) may go: the `host:port` allow-list, the address check
//! on what the name resolves to, and the dial within the connect timeout.

use std::net::{IpAddr, SocketAddr};

use tokio::net::TcpStream;

use proxyfleet_config::ConnectProxy;

/// Whether `target` (host:port) is allowed by a pattern list (`*.` prefix, `*` port).
pub fn allowed(patterns: &[String], target: &str) -> bool {
    let Some((host, port)) = target.rsplit_once(':') else {
        return false;
    };
    patterns.iter().any(|p| {
        let Some((ph, pp)) = p.rsplit_once(':') else {
            return false;
        };
        let port_ok = pp == "*" || pp == port;
        let host_ok = match ph.strip_prefix("*.") {
            Some(suffix) => {
                host.len() > suffix.len()
                    && host.ends_with(suffix)
                    && host.as_bytes()[host.len() - suffix.len() - 1] == b'.'
            }
            None => ph.eq_ignore_ascii_case(host),
        };
        port_ok && host_ok
    })
}

/// Addresses a tunnel may not reach unless `allowedNetworks` names them: this host, its link,
/// private and shared networks (a cluster's pods and Services live there), multicast.
fn is_internal(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_broadcast()
                || v4.is_multicast()
                || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64)
        }
        IpAddr::V6(v6) => match v6.to_ipv4_mapped().or_else(|| embedded_ipv4(v6)) {
            Some(v4) => is_internal(IpAddr::V4(v4)),
            None => {
                let seg0 = v6.segments()[0];
                v6.is_loopback()
                    || v6.is_unspecified()
                    || v6.is_multicast()
                    || (seg0 & 0xfe00) == 0xfc00
                    || (seg0 & 0xffc0) == 0xfe80
            }
        },
    }
}

/// The IPv4 address an IPv6 one reaches through a translator or tunnel: NAT64's well-known
/// and local-use prefixes (RFC 6052, 8215: `64:ff9b::/96`, `64:ff9b:1::/48`), 6to4
/// (`2002::/16`) and the deprecated IPv4-compatible form (`::a.b.c.d`). On an IPv6-only
/// cluster with DNS64 a name resolving to `64:ff9b::a9fe:a9fe` is 169.254.169.254.
fn embedded_ipv4(v6: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let s = v6.segments();
    let o = v6.octets();
    let last = std::net::Ipv4Addr::new(o[12], o[13], o[14], o[15]);
    match s {
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(last),
        [0x64, 0xff9b, 1, ..] => Some(last),
        [0x2002, ..] => Some(std::net::Ipv4Addr::new(o[2], o[3], o[4], o[5])),
        [0, 0, 0, 0, 0, 0, _, _] if !v6.is_loopback() && !v6.is_unspecified() => Some(last),
        _ => None,
    }
}

/// Whether a resolved address may be reached (checked on the address, not the name, so a
/// name that resolves to an internal address is refused: DNS rebinding).
pub fn address_allowed(ip: IpAddr, allowed_networks: &[proxyfleet_config::Cidr]) -> bool {
    !is_internal(ip) || allowed_networks.iter().any(|n| n.contains(ip))
}

/// Why a tunnel's target could not be reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialError {
    /// The name does not resolve.
    DoesNotResolve,
    /// Every address it resolves to is internal and not in `allowedNetworks`.
    AddressNotAllowed,
    /// Resolving or connecting took longer than the connect timeout.
    TimedOut,
    /// The target refused the connection.
    Refused,
    /// Any other connect error (no route, reset...).
    Unreachable,
}

/// Resolves `target` (`host:port`) and connects to its first permitted address, within the
/// connect timeout. Shared by HTTP CONNECT and SOCKS5.
pub async fn dial(connect: &ConnectProxy, target: &str) -> Result<TcpStream, DialError> {
    let networks: Vec<_> = connect
        .allowed_networks
        .iter()
        .filter_map(|n| proxyfleet_config::Cidr::parse(n))
        .collect();
    let deadline = tokio::time::Instant::now() + connect.connect_timeout.get();
    let resolved = match tokio::time::timeout_at(deadline, tokio::net::lookup_host(target)).await {
        Ok(Ok(addrs)) => addrs.collect::<Vec<SocketAddr>>(),
        Ok(Err(_)) => return Err(DialError::DoesNotResolve),
        Err(_) => return Err(DialError::TimedOut),
    };
    let Some(addr) = resolved.iter().find(|a| address_allowed(a.ip(), &networks)).copied() else {
        tracing::debug!(%target, "tunnel refused: the target resolves to internal addresses only");
        return Err(DialError::AddressNotAllowed);
    };
    match tokio::time::timeout_at(deadline, TcpStream::connect(addr)).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) => {
            tracing::debug!(%target, %addr, error = %e, "tunnel target unreachable");
            Err(match e.kind() {
                std::io::ErrorKind::ConnectionRefused => DialError::Refused,
                _ => DialError::Unreachable,
            })
        }
        Err(_) => Err(DialError::TimedOut),
    }
}

#[cfg(test)]
mod tests {
    use super::allowed;

    #[test]
    fn allow_list_patterns() {
        let p = vec!["api.example.com:443".to_string(), "*.internal:*".to_string()];
        assert!(allowed(&p, "api.example.com:443"));
        assert!(!allowed(&p, "api.example.com:80"));
        assert!(allowed(&p, "db.internal:5432"));
        assert!(!allowed(&p, "internal:5432"));
        assert!(!allowed(&p, "evil.com:443"));
    }

    #[test]
    fn internal_addresses_need_an_explicit_network() {
        use super::address_allowed;
        let nets = [proxyfleet_config::Cidr::parse("10.1.0.0/16").unwrap()];
        for internal in [
            "127.0.0.1",
            "10.0.0.5",
            "172.16.3.4",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00::1",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "64:ff9b:1::a00:1",
            "2002:a9fe:a9fe::1",
            "::10.0.0.1",
        ] {
            assert!(!address_allowed(internal.parse().unwrap(), &[]), "{internal}");
        }
        assert!(address_allowed("10.1.2.3".parse().unwrap(), &nets));
        assert!(!address_allowed("10.2.2.3".parse().unwrap(), &nets));
        assert!(address_allowed("93.184.216.34".parse().unwrap(), &[]));
        assert!(address_allowed("2606:2800:220:1::1".parse().unwrap(), &[]));
        assert!(
            address_allowed("64:ff9b::5db8:d822".parse().unwrap(), &[]),
            "NAT64 of a public address"
        );
    }
}
