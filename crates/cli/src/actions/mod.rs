//! One module per family of actions.

pub mod serving;
