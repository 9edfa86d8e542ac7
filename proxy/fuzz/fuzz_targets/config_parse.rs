//! Any text given as a configuration is either accepted or refused with an error; never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(config) = proxyfleet_config::ProxyConfig::from_yaml(text) {
            // What we accept must survive a round trip.
            let again = proxyfleet_config::ProxyConfig::from_yaml(&config.to_yaml());
            assert!(again.is_ok(), "round trip refused: {:?}", again.err());
        }
    }
});
