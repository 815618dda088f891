//! The `/configuration/backends` wire parser and validator: any body is
//! either refused with a path or accepted, and what is accepted encodes,
//! decodes and validates again, whatever DNS answers.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use lua_compat::runtime::{prepare_backend, prepare_backends, RuntimeBackend};

fuzz_target!(|data: &[u8]| {
    // Half the lookups answer with a loopback address, which must be
    // refused, never stored.
    let mut dns = |host: &str, _: u16| -> Vec<IpAddr> {
        if host.len() % 2 == 0 {
            vec!["127.0.0.1".parse().unwrap(), "192.0.2.1".parse().unwrap()]
        } else {
            vec!["192.0.2.2".parse().unwrap()]
        }
    };
    if let Ok(items) = prepare_backends(data, &mut dns) {
        for item in items {
            let rt = RuntimeBackend::decode(&item.runtime).expect("what was encoded decodes");
            assert!(rt.endpoints.iter().all(|e| lua_compat::address::forbidden(e.addr.ip()).is_none()
                || !item.resolves));
            let again = lua_compat::parse_backends(&[b"[", item.json.as_slice(), b"]"].concat())
                .expect("stored JSON parses again");
            lua_compat::validate_backend(&again[0]).expect("stored JSON validates again");
        }
    }
    let _ = prepare_backend(data, "web-80", &mut dns);
});
