//! The `jobs` command line.

fn main() {}
