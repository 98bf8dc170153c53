//! A web dashboard for a jobs store.
