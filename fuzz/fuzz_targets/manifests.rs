//! The manifest reader: any file's text is read into a snapshot (or
//! refused) and built into a model without a panic. (Rendering is covered
//! by the injection tests; it is too slow here for millions of runs.)
#![no_main]

use controller::model::class::ClassFilter;
use controller::model::{build, BuildOptions, Listen};
use controller::snapshot::Snapshot;
use controller::source::manifests::{add_document, parse_text};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    let Ok(docs) = parse_text(text) else { return };
    let config_map = ("ingress-nginx".to_string(), "ingress-nginx-controller".to_string());
    let mut snap = Snapshot::default();
    for (i, doc) in docs.into_iter().enumerate().take(64) {
        let _ = add_document(&mut snap, doc, i as i64, &config_map);
    }
    let opts = BuildOptions {
        class: ClassFilter {
            class: "nginx".into(),
            controller: "k8s.io/ingress-nginx".into(),
            without_class: true,
        },
        allow_snippets: false,
        default_backend_service: None,
        namespace: None,
        listen: Listen {
            address: "127.0.0.1".into(),
            http_port: 80,
            https_port: 443,
            api_port: 10246,
        },
        endpoints: Default::default(),
    };
    let model = build(&snap, &opts);
    if let Some(structure) = &model.structure {
        for server in &structure.servers {
            assert!(server.hostname == "_" || controller::model::values::Host::parse(&server.hostname).is_ok());
        }
    }
});
