-- Runs the chart's AppRollout health check against sample statuses
-- (lua5.1 e2e/gitops/argocd-health-approllout-test.lua charts/proxyfleet/files/argocd-health-approllout.lua).
local script = assert(io.open(arg[1] or "charts/proxyfleet/files/argocd-health-approllout.lua")):read("*a")
local function run(o)
  obj = o
  return assert(loadstring(script))()
end
local function st(phase, ready, reason)
  return { metadata = { generation = 1 }, status = { observedGeneration = 1, weight = 30, stableRevision = "abc",
    canary = { phase = phase, message = "why" }, conditions = { { type = "Ready", status = ready, reason = reason, message = "m" } } } }
end
local cases = {
  { name = "no status", obj = { metadata = { generation = 1 } }, want = "Progressing" },
  { name = "stale generation", obj = { metadata = { generation = 2 }, status = { observedGeneration = 1 } }, want = "Progressing" },
  { name = "stable", obj = st("Idle", "True", "Stable"), want = "Healthy" },
  { name = "promoted", obj = st("Completed", "True", "Stable"), want = "Healthy" },
  { name = "rolling out", obj = st("Progressing", "True", "RolloutInProgress"), want = "Progressing" },
  { name = "paused", obj = st("Paused", "True", "RolloutInProgress"), want = "Suspended" },
  { name = "aborted", obj = st("Aborted", "False", "RolloutAborted"), want = "Degraded" },
  { name = "workload missing", obj = st("Idle", "False", "WorkloadNotFound"), want = "Degraded" },
  { name = "weights on their way", obj = st("Progressing", "False", "WeightsPending"), want = "Progressing" },
}
local passed, failed = 0, 0
for _, c in ipairs(cases) do
  local hs = run(c.obj)
  if hs.status == c.want then
    passed = passed + 1
  else
    failed = failed + 1
    print("FAIL " .. c.name .. ": got " .. hs.status .. ", want " .. c.want)
  end
end
print(passed .. " passed, " .. failed .. " failed")
os.exit(failed == 0 and 0 or 1)
