//! A status condition as this controller decides it: type, status,
//! reason and message. Its times and `observedGeneration` are added when
//! it is written ([`super::status::conditions_json`]).

/// A condition without its times (added when written).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cond {
    pub type_: &'static str,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

pub fn cond(type_: &'static str, status: bool, reason: &str, message: impl Into<String>) -> Cond {
    Cond {
        type_,
        status,
        reason: reason.into(),
        message: message.into(),
    }
}
