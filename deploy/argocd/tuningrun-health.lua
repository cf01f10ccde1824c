-- Argo CD health check for fleettune.dev/TuningRun (Lua 5.1, as Argo CD runs it).
-- Maps the conditions the operator writes (Ready, Progressing, Degraded, each with
-- observedGeneration) to Healthy / Progressing / Degraded. Install: see README.md.
local hs = {}

local function condition(conditions, kind)
  for _, c in ipairs(conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end

local generation = obj.metadata and obj.metadata.generation or nil
local status = obj.status
if status == nil or status.conditions == nil or #status.conditions == 0 then
  hs.status = "Progressing"
  hs.message = "Waiting for the fleettune operator to pick up the run"
  return hs
end

-- A status written for an older spec says nothing about the current one.
if generation ~= nil and status.observedGeneration ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local conditions = status.conditions
local ready = condition(conditions, "Ready")
local progressing = condition(conditions, "Progressing")
local degraded = condition(conditions, "Degraded")

local function stale(c)
  return generation ~= nil and c.observedGeneration ~= nil and c.observedGeneration < generation
end

local function describe(c, fallback)
  local text = fallback
  if c ~= nil and c.message ~= nil and c.message ~= "" then
    text = c.message
  end
  if c ~= nil and c.reason ~= nil and c.reason ~= "" then
    text = c.reason .. ": " .. text
  end
  return text
end

if (ready ~= nil and stale(ready)) or (degraded ~= nil and stale(degraded)) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

-- Degraded wins over Ready: a finished run with a failed pool still needs a person.
if degraded ~= nil and degraded.status == "True" then
  hs.status = "Degraded"
  hs.message = describe(degraded, "A target pool failed or cannot be scheduled")
  return hs
end

if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
  local summary = status.bestSummary
  if summary ~= nil and summary ~= "" then
    hs.message = "Tuned: " .. summary
  else
    hs.message = describe(ready, "Tuned")
  end
  return hs
end

if progressing ~= nil and progressing.status == "True" then
  hs.status = "Progressing"
  local progress = status.progress
  if progress ~= nil and progress ~= "" then
    hs.message = "Tuning: " .. progress .. " trials"
  else
    hs.message = describe(progressing, "Tuning")
  end
  return hs
end

-- Finished without being Ready and without saying why: treat as failed, not as waiting.
if ready ~= nil and ready.status == "False" and progressing ~= nil and progressing.status == "False" then
  hs.status = "Degraded"
  hs.message = describe(ready, "The run finished without a result")
  return hs
end

hs.status = "Progressing"
hs.message = describe(ready, "Waiting for the run's conditions")
return hs
