-- complete_plain.lua: what complete.lua's hot path is given for its graph tail: none
-- (see complete.lua's header).
local GRAPH = false
