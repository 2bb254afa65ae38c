-- wrk script: POST a fixed JSON body (read from the file named by BENCH_BODY_FILE, API key from
-- BENCH_KEY) and print a one-line JSON summary at the end, for scripts/bench/run.py. With
-- BENCH_DELAY_MS set, each connection waits that long on average after each answer (a fixed
-- request rate). The waits are drawn at random (exponentially distributed): equal waits keep the
-- connections in step, so their requests would arrive together as one burst per period, and the
-- median would measure where a request falls in the proxy's queue for that burst.
local f = assert(io.open(os.getenv("BENCH_BODY_FILE"), "rb"))
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")

local pause = tonumber(os.getenv("BENCH_DELAY_MS") or "")
if pause then
  math.randomseed(os.time())
  function delay()
    -- wrk keeps whole milliseconds; adding a uniform [0, 1) before flooring keeps the mean.
    return math.floor(-pause * math.log(1 - math.random()) + math.random())
  end
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRKJSON {"requests":%d,"duration_us":%d,"bytes":%d,"connect_errors":%d,"read_errors":%d,' ..
    '"write_errors":%d,"status_errors":%d,"timeouts":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write, e.status,
    e.timeout, latency:percentile(50), latency:percentile(90), latency:percentile(99)))
end
