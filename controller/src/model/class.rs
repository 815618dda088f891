//! Which Ingresses belong to this controller, with ingress-nginx's rules.

use std::sync::Arc;

use k8s_openapi::api::networking::v1::{Ingress, IngressClass};

/// The legacy annotation that predates `spec.ingressClassName`.
pub const LEGACY_CLASS_ANNOTATION: &str = "kubernetes.io/ingress.class";
const DEFAULT_CLASS_ANNOTATION: &str = "ingressclass.kubernetes.io/is-default-class";

#[derive(Debug, Clone)]
pub struct ClassFilter {
    /// `--ingress-class`: the class name this controller serves.
    pub class: String,
    /// `--controller-class`: the `spec.controller` of IngressClasses it owns.
    pub controller: String,
    /// `--watch-ingress-without-class`.
    pub without_class: bool,
}

impl ClassFilter {
    /// ingress-nginx's order: the legacy annotation decides when present;
    /// then `spec.ingressClassName`, which must name our class or an
    /// IngressClass whose controller is ours; an Ingress with neither is
    /// ours if our IngressClass is the cluster default, or with
    /// `--watch-ingress-without-class`.
    pub fn accepts(&self, ing: &Ingress, classes: &[Arc<IngressClass>]) -> bool {
        if let Some(legacy) = ing
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(LEGACY_CLASS_ANNOTATION))
        {
            return *legacy == self.class;
        }
        let ours = |c: &IngressClass| c.spec.as_ref().and_then(|s| s.controller.as_deref()) == Some(&*self.controller);
        match ing.spec.as_ref().and_then(|s| s.ingress_class_name.as_deref()) {
            Some(name) => {
                name == self.class
                    || classes
                        .iter()
                        .any(|c| c.metadata.name.as_deref() == Some(name) && ours(c))
            }
            None => {
                self.without_class
                    || classes.iter().any(|c| {
                        ours(c)
                            && c.metadata
                                .annotations
                                .as_ref()
                                .and_then(|a| a.get(DEFAULT_CLASS_ANNOTATION))
                                .map(String::as_str)
                                == Some("true")
                    })
            }
        }
    }
}
