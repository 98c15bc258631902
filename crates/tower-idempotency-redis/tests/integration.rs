//! The Redis store's tests, one binary, on real `redis-server` processes started by the test
//! harness (they fail, never skip, when `redis-server` is missing).

mod support;

mod approvals;
mod cli;
mod conformance;
mod durability;
mod isolation;
mod operator;
mod quota;
mod retention;
