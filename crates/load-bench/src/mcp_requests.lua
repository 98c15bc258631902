-- wrk script of the MCP suite (crates/load-bench): `tools/call` of the mcp-demo's
-- `create_ticket` (no sleeping with the demo's default delays of 0) over a Streamable HTTP
-- session (2025-06-18) that load-bench opened once per server (`initialize`, then
-- `notifications/initialized`); its id comes in the environment as MCP_SESSION_ID.
-- Arguments: <run id> <fresh|replay>.
--   fresh:  a new explicit key per request, params._meta["dev.tower-idempotency/idempotency-key"]
--           (the arguments stay the same, so only the key makes each call a new execution);
--   replay: one fixed key: the first call executes, every later one is a retry of a completed
--           execution and is answered from its record.
-- The unguarded server gets the same bytes (rmcp ignores the _meta member).
-- A failure is a status outside 2xx, a JSON-RPC error, a tool error (isError) or an answer
-- without a result; failures are counted and the first one is printed.

local threads = {}
local counter = 0
failures = 0
replayed = 0
sample = ""

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
  ["Accept"] = "application/json, text/event-stream",
  ["MCP-Protocol-Version"] = "2025-06-18",
  ["Mcp-Session-Id"] = os.getenv("MCP_SESSION_ID") or "",
}

function request()
  counter = counter + 1
  local key
  if mode == "replay" then
    key = "replayed-" .. run
  else
    key = string.format("%s-%d-%d", run, thread_no or 0, counter)
  end
  local body = string.format(
    '{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{"name":"create_ticket",' ..
    '"arguments":{"project":"web","title":"Login button does nothing"},' ..
    '"_meta":{"dev.tower-idempotency/idempotency-key":"%s"}}}',
    counter, key)
  return wrk.format("POST", "/mcp", headers, body)
end

function response(status, headers, body)
  local failed = status < 200 or status > 299
  if not failed then
    failed = body:find('"error":{', 1, true) ~= nil
      or body:find('"isError":true', 1, true) ~= nil
      or body:find('"result":', 1, true) == nil
  end
  if body:find('"replayed":true', 1, true) then
    replayed = replayed + 1
  end
  if failed then
    failures = failures + 1
    if sample == "" then
      sample = status .. " " .. string.gsub(string.sub(body, 1, 400), "\n", "\\n")
    end
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  local failed, replays, first = 0, 0, ""
  for _, thread in ipairs(threads) do
    failed = failed + (thread:get("failures") or 0)
    replays = replays + (thread:get("replayed") or 0)
    local s = thread:get("sample") or ""
    if first == "" then first = s end
  end
  io.write(string.format(
    "RESULT requests=%d duration_us=%d p50_us=%d p99_us=%d non2xx=%d socket_errors=%d failures=%d replayed=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    e.status, e.connect + e.read + e.write + e.timeout, failed, replays))
  if first ~= "" then
    io.write("FAILURE " .. first .. "\n")
  end
end
