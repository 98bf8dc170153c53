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
--
-- An ended job someone waits for (`awt`, CONTRACT O2) is announced here too, since the
-- claim script that buried it announces nothing.

local g = graph_tail()
local endings = {}
local announced = {}
for i = 1, g.own_keys do
  local v = redis.call('HMGET', KEYS[i], 'state', 'awt')
  local state = v[1]
  if state == 'succeeded' or state == 'dead' or state == 'cancelled' then
    endings[#endings + 1] = { ARGV[i], state }
    if v[2] then
      announced[#announced + 1] = ARGV[i]
    end
  end
end
local plan, need = settle_plan(g, endings)
if not plan then
  return { 'need', need }
end
settle_write(g, plan)
for _, id in ipairs(announced) do
  announce_ending(g.channel, id)
end
return { 'ok', #endings }
