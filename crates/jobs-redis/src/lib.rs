#![doc = include_str!("../README.md")]
#![deny(missing_docs)]

mod codec;
mod conn;
mod keys;
mod scripts;
mod store;
mod wake;

pub use store::{ReclaimReport, RedisStore};
