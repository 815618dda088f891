//! The API's status and health answers, as this client reads them.
//!
//! `lua_compat::api::Status` and `EndpointHealth` are the module's side:
//! they only serialize. These readers mirror their field names, and every
//! field has a default, so a module one version older or newer (a field
//! added or gone) still prints. Backends need no reader of their own: they
//! are read as the wire contract's `lua_compat::wire::Backend`.

use serde::Deserialize;

/// `GET /configuration/status`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Status {
    pub generation: u64,
    pub backends: u64,
    pub endpoints: u64,
    pub zone: Zone,
    pub workers: Vec<Worker>,
    pub endpoint_table: EndpointTable,
    pub lock_recovered: u64,
    /// Present when nginx has `dynamic_balancer_state`.
    pub state_file: Option<StateFile>,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct StateFile {
    pub path: String,
    /// The generation whose backends the file holds (0: none yet).
    pub generation: u64,
    /// The last write's failure; none after a success.
    pub error: Option<String>,
    pub write_us: u64,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Zone {
    pub name: String,
    pub size: u64,
    pub used: u64,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Worker {
    pub pid: i64,
    /// The last generation this worker applied.
    pub generation: u64,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct EndpointTable {
    /// Slots so far (the table grows with the zone).
    pub capacity: u64,
    pub tracked: u64,
    pub untracked: u64,
    /// Slots given to another backend's endpoint below its fair share.
    pub evicted: u64,
    pub bytes: u64,
}

/// `GET /configuration/health`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Health {
    pub endpoints: Vec<EndpointHealth>,
    pub tracked: u64,
    pub capacity: u64,
}

#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct EndpointHealth {
    pub backend: String,
    pub endpoint: String,
    pub down: bool,
    pub fails: u32,
    pub connections: u32,
    /// Seconds.
    pub ewma: f64,
    /// Absent from modules before the growing table: tracked.
    pub tracked: Option<bool>,
}

/// `{"generation": N}`, the answer to a successful write.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default)]
pub struct Written {
    pub generation: u64,
}

/// Reads an answer's JSON, or says which answer was not what was expected.
pub fn read<T: serde::de::DeserializeOwned>(what: &str, body: &[u8]) -> Result<T, String> {
    serde_json::from_slice(body).map_err(|e| format!("the answer to {what} is not what this client expects: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shape the module writes (`lua_compat::api::Status`; built as
    /// JSON here so a field the module adds does not break this test).
    #[test]
    fn reads_what_the_module_writes() {
        let status = serde_json::json!({
            "generation": 7, "backends": 2, "endpoints": 3,
            "zone": {"name": "dynamic_balancer", "size": 1 << 25, "used": 123_456},
            "workers": [{"pid": 41, "generation": 7}, {"pid": 42, "generation": 6}],
            "endpoint_table": {"capacity": 100, "tracked": 3, "untracked": 0, "evicted": 2, "bytes": 9000},
            "lock_recovered": 1,
        });
        let read_back: Status = read("status", &serde_json::to_vec(&status).unwrap()).unwrap();
        assert_eq!(read_back.generation, 7);
        assert_eq!(read_back.zone.used, 123_456);
        assert_eq!(read_back.workers[1], Worker { pid: 42, generation: 6 });
        assert_eq!(read_back.endpoint_table.capacity, 100);
        assert_eq!(read_back.endpoint_table.evicted, 2);
        assert_eq!(read_back.lock_recovered, 1);

        let h = lua_compat::api::EndpointHealth {
            backend: "web".into(),
            endpoint: "[::1]:80".into(),
            down: true,
            fails: 2,
            connections: 1,
            ewma: 0.25,
            tracked: false,
        };
        let body = serde_json::json!({"endpoints": [h], "tracked": 1, "capacity": 10});
        let health: Health = read("health", body.to_string().as_bytes()).unwrap();
        assert_eq!(health.endpoints[0].endpoint, "[::1]:80");
        assert!(health.endpoints[0].down);
        assert_eq!(health.endpoints[0].tracked, Some(false));
        assert_eq!((health.tracked, health.capacity), (1, 10));

        // Older or newer modules: missing and extra fields are fine.
        let s: Status = read("status", br#"{"generation":1,"new_field":true}"#).unwrap();
        assert_eq!((s.generation, s.workers.len()), (1, 0));
        assert!(read::<Status>("status", br#"{"generation":"x"}"#)
            .unwrap_err()
            .contains("the answer to status"));
    }
}
