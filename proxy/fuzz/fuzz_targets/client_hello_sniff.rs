//! The TLS passthrough's ClientHello sniffer: any bytes, split anywhere, give NeedMore, a
//! Hello or NotTls, never a panic; splitting the same bytes differently never changes a
//! Hello's server name; more than MAX_HELLO_BYTES is always NotTls.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proxyfleet_proxy::passthrough::sniff::{Sniffed, Sniffer, MAX_HELLO_BYTES};

fn run(data: &[u8], chunk: usize) -> Sniffed {
    let mut s = Sniffer::default();
    let mut last = Sniffed::NeedMore;
    for part in data.chunks(chunk.max(1)) {
        last = s.feed(part);
        if last != Sniffed::NeedMore {
            break;
        }
    }
    last
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, bytes)) = data.split_first() else { return };
    let whole = run(bytes, bytes.len());
    let pieces = run(bytes, split as usize);
    if let (Sniffed::Hello { server_name: a }, Sniffed::Hello { server_name: b }) = (&whole, &pieces) {
        assert_eq!(a, b, "the server name depends on how the bytes arrived");
        assert!(a.as_deref().is_none_or(|n| n == n.to_ascii_lowercase()));
    }
    if bytes.len() > MAX_HELLO_BYTES && whole == Sniffed::NeedMore {
        panic!("more than MAX_HELLO_BYTES and still waiting");
    }
});
