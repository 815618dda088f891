//! The manifest reader: any file's text is read into a snapshot (or
//! refused) and built into a model without a panic, the layer-4
//! ConfigMaps and ssl-passthrough included. (Rendering is covered
//! by the injection tests; it is too slow here for millions of runs.)
#![no_main]

use controller::model::{build, BuildOptions};
use controller::snapshot::{ConfigMapRefs, Snapshot};
use controller::source::manifests::{add_document, parse_text};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(docs) = parse_text(text) else { return };
    let cm = |name: &str| ("ingress-nginx".to_string(), name.to_string());
    let refs = ConfigMapRefs {
        config_map: cm("ingress-nginx-controller"),
        tcp_services: Some(cm("tcp-services")),
        udp_services: Some(cm("udp-services")),
    };
    let mut snap = Snapshot::default();
    for (i, doc) in docs.into_iter().enumerate().take(64) {
        let _ = add_document(&mut snap, doc, i as i64, &refs);
    }
    let mut opts = BuildOptions::default();
    opts.class.without_class = true;
    opts.ssl_passthrough = true;
    let model = build(&snap, &opts);
    if let Some(structure) = &model.structure {
        for server in &structure.servers {
            assert!(server.hostname == "_" || controller::model::values::Host::parse(&server.hostname).is_ok());
        }
        // Layer 4: only accepted entries, on ports nginx can listen on.
        for t in &structure.stream_servers {
            assert!(t.port != 0 && t.port != opts.listen.http_port && t.port != opts.listen.https_port);
        }
    }
});
