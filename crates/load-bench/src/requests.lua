-- wrk script of the load benchmark (crates/load-bench): POST /v1/payments with a fresh
-- Idempotency-Key per request (and the same string as the invoice reference, so every
-- payment is new), or one fixed key for replays.
-- Arguments: <run id> <fresh|replay>.

local threads = {}
local counter = 0

function setup(thread)
  thread:set("thread_no", #threads + 1)
  table.insert(threads, thread)
end

function init(args)
  run = args[1] or "run"
  mode = args[2] or "fresh"
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
  local body = string.format(
    '{"amount_minor": 1250, "currency": "EUR", "invoice_ref": "inv-%s", "payee": "Acme Supplies Ltd"}',
    key)
  return wrk.format("POST", "/v1/payments", headers, body)
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d non2xx=%d socket_errors=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout))
end
