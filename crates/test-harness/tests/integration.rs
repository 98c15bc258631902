//! The test harness's own tests (one integration-test binary; each file a module).

mod redis;
