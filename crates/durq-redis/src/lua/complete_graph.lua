-- complete_graph.lua: complete.lua for a batch in which some job has jobs waiting for it
-- (CONTRACT G1, G3): its KEYS and ARGV as complete.lua's, then a graph tail (graph.lua).
local GRAPH = graph_tail()
