//! Every refusal of a guarded request goes out here: its decision recorded, one log line,
//! and the problem response under the layer's problem base.

use bytes::Bytes;
use http::Response;
use http_body::Body;

use crate::body::ResponseBody;
use crate::config::Shared;
use crate::problem::Rejection;
use crate::telemetry;

/// The problem response for `rejection`, with the layer's type base and status path.
pub(crate) fn problem(shared: &Shared, rejection: &Rejection) -> Response<Bytes> {
    rejection.to_response(&shared.problem_base, &shared.status_path)
}

/// Refuses the current guarded request with `rejection`.
pub(crate) fn refuse<ResB: Body>(
    shared: &Shared,
    rejection: Rejection,
) -> Response<ResponseBody<ResB>> {
    let decision = telemetry::decision_of(&rejection);
    telemetry::record(decision);
    tracing::info!(
        decision = decision.as_str(),
        problem = rejection.slug(),
        status = rejection.status().as_u16(),
        "idempotency refusal"
    );
    problem(shared, &rejection).map(ResponseBody::full)
}
