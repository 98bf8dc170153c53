-- settle.lua: settles the jobs waiting for jobs that already ended (CONTRACT G1, G3),
-- for the endings a script could not settle itself: the buries of claim.lua,
-- claim_fit.lua and claim_limited.lua, whose hot path takes no graph tail. Rust calls it
-- right after such a claim (store/claim.rs).
--
-- KEYS[i] the hash of job i, whose id is ARGV[i]; then a graph tail (graph.lua)
-- ARGV[i] the id of job i; then a graph tail
--
-- Returns {'ok', settled}: how many of the jobs had ended (a job not ended yet, or gone,
-- is left alone), or {'need', {id, ...}} (graph.lua; nothing written).

local g = graph_tail()
local endings = {}
for i = 1, g.own_keys do
  local state = redis.call('HGET', KEYS[i], 'state')
  if state == 'succeeded' or state == 'dead' or state == 'cancelled' then
    endings[#endings + 1] = { ARGV[i], state }
  end
end
local plan, need = settle_plan(g, endings)
if not plan then
  return { 'need', need }
end
settle_write(g, plan)
return { 'ok', #endings }
