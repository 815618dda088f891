//! nginx's process hooks: `init_module` in the master (the state file into
//! a new zone), `init_process`/`exit_process` in each worker and the
//! worker's idle sync timer.
//!
//! May use every floor below it.

pub mod init_module;
pub mod timer;
