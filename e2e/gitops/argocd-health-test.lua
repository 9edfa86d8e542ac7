-- Runs the chart's Argo CD health check against sample statuses (lua5.1 e2e/gitops/argocd-health-test.lua).
local script = assert(io.open(arg[1] or "charts/proxyfleet/files/argocd-health.lua")):read("*a")
local function run(o)
  obj = o
  return assert(loadstring(script))()
end
local cases = {
  { name = "no status", obj = { metadata = { generation = 1 } }, want = "Progressing" },
  { name = "stale generation", obj = { metadata = { generation = 2 }, status = { observedGeneration = 1, phase = "Ready",
      conditions = { { type = "Ready", status = "True" } } } }, want = "Progressing" },
  { name = "ready", obj = { metadata = { generation = 1 }, status = { observedGeneration = 1, phase = "Ready",
      conditions = { { type = "Ready", status = "True", message = "2/2 ready" }, { type = "Degraded", status = "False" } } } }, want = "Healthy" },
  { name = "degraded", obj = { metadata = { generation = 1 }, status = { observedGeneration = 1, phase = "Degraded",
      conditions = { { type = "Degraded", status = "True", reason = "RolloutAborted", message = "5xx 20%" } } } }, want = "Degraded" },
  { name = "paused canary", obj = { metadata = { generation = 1 }, status = { observedGeneration = 1, phase = "Progressing",
      canary = { phase = "Paused", currentStepIndex = 1, weight = 20 }, conditions = {} } }, want = "Suspended" },
  { name = "rolling", obj = { metadata = { generation = 1 }, status = { observedGeneration = 1, phase = "Progressing",
      conditions = { { type = "Progressing", status = "True", message = "1/2 updated" } } } }, want = "Progressing" },
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
