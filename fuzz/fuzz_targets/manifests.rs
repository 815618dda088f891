//! The manifest reader: any file's text is read into a snapshot (or
//! refused) and built into a model without a panic. (Rendering is covered
//! by the injection tests; it is too slow here for millions of runs.)
#![no_main]

use controller::model::{build, BuildOptions};
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
    let mut opts = BuildOptions::default();
    opts.class.without_class = true;
    let model = build(&snap, &opts);
    if let Some(structure) = &model.structure {
        for server in &structure.servers {
            assert!(server.hostname == "_" || controller::model::values::Host::parse(&server.hostname).is_ok());
        }
    }
});
