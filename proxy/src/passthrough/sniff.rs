//! Reading the SNI of a TLS ClientHello without terminating TLS. The parsing is rustls' own
//! (`Acceptor`, the code that parses every ClientHello our TLS listeners accept), fed a copy of
//! the bytes; the bytes themselves are relayed to the backend untouched.

use rustls::server::Acceptor;

/// The ClientHello may span several records; more than this is refused (a real one is a few
/// hundred bytes, post-quantum key shares bring it near 2 KiB).
pub const MAX_HELLO_BYTES: usize = 16 * 1024;

/// What the bytes seen so far say.
#[derive(Debug, PartialEq, Eq)]
pub enum Sniffed {
    /// Not a complete ClientHello yet: read more.
    NeedMore,
    /// A complete ClientHello, with its server name if it sent one.
    Hello { server_name: Option<String> },
    /// Not TLS, or a ClientHello rustls refuses, or too long.
    NotTls,
}

/// Feeds the connection's first bytes, as they arrive, to a ClientHello parser.
#[derive(Default)]
pub struct Sniffer {
    acceptor: Acceptor,
    seen: usize,
}

impl Sniffer {
    /// Takes the next bytes read from the client.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Sniffed {
        self.seen += bytes.len();
        if self.seen > MAX_HELLO_BYTES {
            return Sniffed::NotTls;
        }
        while !bytes.is_empty() {
            match self.acceptor.read_tls(&mut bytes) {
                Ok(0) | Err(_) => return Sniffed::NotTls,
                Ok(_) => {}
            }
        }
        match self.acceptor.accept() {
            Ok(None) => Sniffed::NeedMore,
            Ok(Some(accepted)) => Sniffed::Hello {
                server_name: accepted.client_hello().server_name().map(str::to_ascii_lowercase),
            },
            Err(_) => Sniffed::NotTls,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// A real ClientHello from rustls' client, for `name` (None: no SNI, as for an IP).
    fn client_hello(name: &str) -> Vec<u8> {
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        let server_name = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
        let mut conn = rustls::ClientConnection::new(Arc::new(config), server_name).unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[test]
    fn reads_the_server_name_whole_or_byte_by_byte() {
        let hello = client_hello("DB.example.com");
        assert_eq!(
            Sniffer::default().feed(&hello),
            Sniffed::Hello {
                server_name: Some("db.example.com".into())
            }
        );
        let mut s = Sniffer::default();
        for (i, b) in hello.iter().enumerate() {
            let got = s.feed(std::slice::from_ref(b));
            if i + 1 < hello.len() {
                assert_eq!(got, Sniffed::NeedMore, "at byte {i}");
            } else {
                assert!(matches!(got, Sniffed::Hello { .. }));
            }
        }
    }

    #[test]
    fn no_sni_for_an_ip_and_garbage_is_not_tls() {
        assert_eq!(
            Sniffer::default().feed(&client_hello("10.0.0.1")),
            Sniffed::Hello { server_name: None }
        );
        assert_eq!(
            Sniffer::default().feed(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
            Sniffed::NotTls
        );
        assert_eq!(Sniffer::default().feed(&[0x16, 0x03, 0x01]), Sniffed::NeedMore);
        let mut s = Sniffer::default();
        // A handshake record header announcing 16 KiB, then endless bytes: refused at the cap.
        assert_eq!(s.feed(&[0x16, 0x03, 0x01, 0x40, 0x00]), Sniffed::NeedMore);
        let filler = vec![0u8; MAX_HELLO_BYTES];
        assert_eq!(s.feed(&filler), Sniffed::NotTls);
    }
}
