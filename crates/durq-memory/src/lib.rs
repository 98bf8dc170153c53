#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod backend;
mod server;
mod store;

pub use backend::MemoryBackend;
pub use server::MemoryServer;
