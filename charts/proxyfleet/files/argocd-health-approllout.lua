-- Argo CD health of an AppRollout (resource.customizations.health.proxyfleet.io_AppRollout).
hs = { status = "Progressing", message = "waiting for the operator" }
if obj.status == nil or obj.status.observedGeneration ~= obj.metadata.generation then
  return hs
end
local canary = obj.status.canary or {}
local phase = canary.phase or "Idle"
local ready = nil
for _, c in ipairs(obj.status.conditions or {}) do
  if c.type == "Ready" then ready = c end
end
if phase == "Aborted" then
  hs.status = "Degraded"
  hs.message = canary.message or "rollout aborted"
elseif phase == "Paused" then
  hs.status = "Suspended"
  hs.message = "rollout paused at " .. tostring(obj.status.weight or 0) .. "%"
elseif ready ~= nil and ready.status == "False" then
  if ready.reason == "WeightsPending" then
    hs.message = ready.message
  else
    hs.status = "Degraded"
    hs.message = (ready.reason or "") .. ": " .. (ready.message or "")
  end
elseif phase == "Completed" or phase == "Idle" then
  hs.status = "Healthy"
  hs.message = "stable at " .. (obj.status.stableRevision or "?")
else
  hs.message = phase .. " at " .. tostring(obj.status.weight or 0) .. "%"
end
return hs
