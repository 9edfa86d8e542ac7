-- Argo CD health check for proxyfleet.io/ProxyDeployment (Lua 5.1, as Argo CD embeds).
-- Install: add under resource.customizations.health.proxyfleet.io_ProxyDeployment in argocd-cm
-- (see docs/gitops.md).
local hs = { status = "Progressing", message = "Waiting for the operator" }
if obj.status == nil then
  return hs
end
local st = obj.status
if st.observedGeneration ~= nil and obj.metadata.generation ~= nil and st.observedGeneration < obj.metadata.generation then
  hs.message = "The operator has not seen the latest spec yet"
  return hs
end
local function condition(t)
  if st.conditions == nil then return nil end
  for _, c in ipairs(st.conditions) do
    if c.type == t then return c end
  end
  return nil
end
local degraded = condition("Degraded")
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = (degraded.reason or "") .. ": " .. (degraded.message or "")
  return hs
end
if st.canary ~= nil and st.canary.phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "Canary paused at step " .. tostring(st.canary.currentStepIndex) .. " (weight " .. tostring(st.canary.weight) .. "%)"
  return hs
end
local ready = condition("Ready")
if ready ~= nil and ready.status == "True" and st.phase == "Ready" then
  hs.status = "Healthy"
  hs.message = ready.message or "Ready"
  return hs
end
local progressing = condition("Progressing")
if progressing ~= nil then
  hs.message = progressing.message or hs.message
end
return hs
