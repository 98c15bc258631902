-- wrk script of the load benchmark (crates/load-bench): a write with a fresh Idempotency-Key
-- per request, or one fixed key for replays.
-- Arguments: <run id> <fresh|replay> <tickets|payments> [body bytes].
--   tickets:  POST /v1/tickets, the same ticket every time (the demo keeps no uniqueness
--             rule on tickets without a source_event_id, so every execution creates one);
--   payments: POST /v1/payments with the key as the invoice reference, so every execution
--             is a new payment (the invoice rule is a unique constraint).

local threads = {}
local counter = 0

function setup(thread)
  thread:set("thread_no", #threads + 1)
  table.insert(threads, thread)
end

local ticket = '{"project": "web", "title": "Login button does nothing", "priority": "high", ' ..
  '"description": "Clicking the login button on the landing page does nothing in Firefox 131."}'

function init(args)
  run = args[1] or "run"
  mode = args[2] or "fresh"
  route = args[3] or "tickets"
  -- A body of this many bytes (0: the usual ticket): the description padded to it.
  local size = tonumber(args[4] or "0") or 0
  if size > 0 then
    local frame = '{"project": "web", "title": "Login button does nothing", "priority": "high", ' ..
      '"description": ""}'
    ticket = '{"project": "web", "title": "Login button does nothing", "priority": "high", ' ..
      '"description": "' .. string.rep("x", math.max(0, size - #frame)) .. '"}'
  end
end

local headers = {
  ["Authorization"] = "Bearer acme",
  ["Content-Type"] = "application/json",
}

function request()
  counter = counter + 1
  local key
  if mode == "replay" then
    key = "replayed-" .. run
  else
    key = string.format("%s-%d-%d", run, thread_no or 0, counter)
  end
  headers["Idempotency-Key"] = key
  if route == "payments" then
    local body = string.format(
      '{"amount_minor": 1250, "currency": "EUR", "invoice_ref": "inv-%s", "payee": "Acme Supplies Ltd"}',
      key)
    return wrk.format("POST", "/v1/payments", headers, body)
  end
  return wrk.format("POST", "/v1/tickets", headers, ticket)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d non2xx=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
