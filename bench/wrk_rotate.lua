-- wrk script: POST the request bodies of a file (one JSON per line) in turn, and count the
-- X-Cache value and status of every response so the report can prove hits were hits.
--   wrk ... -s bench/wrk_rotate.lua URL -- BODIES_FILE CATEGORY [REQUESTS_PER_THREAD]
-- With REQUESTS_PER_THREAD, each thread stops sending after that many responses (wrk itself
-- still runs for its duration).
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  bodies = {}
  for line in io.lines(args[1]) do
    if #line > 0 then table.insert(bodies, line) end
  end
  category = args[2] or "faq"
  limit = tonumber(args[3] or "0")
  answered = 0
  index = math.random(#bodies)
  counts = {}
end

function request()
  index = index % #bodies + 1
  return wrk.format("POST", "/v1/chat/completions",
    {["Content-Type"] = "application/json", ["X-Cache-Category"] = category}, bodies[index])
end

function response(status, headers, body)
  local key = tostring(status) .. ":" .. (headers["X-Cache"] or headers["x-cache"] or "none")
  counts[key] = (counts[key] or 0) + 1
  answered = answered + 1
  if limit > 0 and answered >= limit then wrk.thread:stop() end
end

function done(summary, latency, requests)
  local total = {}
  for _, thread in ipairs(threads) do
    local thread_counts = thread:get("counts")
    for key, n in pairs(thread_counts) do total[key] = (total[key] or 0) + n end
  end
  io.write("OUTCOMES")
  for key, n in pairs(total) do io.write(" " .. key .. "=" .. n) end
  io.write("\n")
  io.write(string.format("LATENCY_US p50=%d p90=%d p99=%d mean=%.1f\n",
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.mean))
  io.write(string.format("THROUGHPUT requests=%d seconds=%.3f errors=%d\n",
    summary.requests, summary.duration / 1e6,
    summary.errors.connect + summary.errors.read + summary.errors.write + summary.errors.status + summary.errors.timeout))
end
