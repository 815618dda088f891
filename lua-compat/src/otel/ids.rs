//! Trace and span ids: random, from a per-worker ChaCha stream seeded
//! once from the operating system (as [`crate::request_id`] does for
//! request ids), so an id costs a fraction of a block, not a system call.

use rand_chacha::ChaCha12Rng;
use rand_core::{RngCore, SeedableRng};

use super::trace_context::{SpanId, TraceId};

/// A per-process id source; create it after `fork()` (nginx's
/// `init_process`), or workers would share ids.
pub struct IdGenerator(ChaCha12Rng);

impl IdGenerator {
    pub fn from_os() -> Result<IdGenerator, String> {
        ChaCha12Rng::try_from_os_rng()
            .map(IdGenerator)
            .map_err(|e| format!("no seed from the operating system: {e}"))
    }

    pub fn from_seed(seed: [u8; 32]) -> IdGenerator {
        IdGenerator(ChaCha12Rng::from_seed(seed))
    }

    /// A new trace id, never all zero.
    pub fn trace_id(&mut self) -> TraceId {
        loop {
            let mut id = [0u8; 16];
            self.0.fill_bytes(&mut id);
            if id != [0; 16] {
                return id;
            }
        }
    }

    /// A new span id, never all zero.
    pub fn span_id(&mut self) -> SpanId {
        loop {
            let id = self.0.next_u64().to_ne_bytes();
            if id != [0; 8] {
                return id;
            }
        }
    }
}
