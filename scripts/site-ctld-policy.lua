-- job_submit plugin of scripts/site-ctld.sh: the limits a site enforces beyond its partitions (QOS limits,
-- size bins inside one partition), read from @POLICY@, one rule a line: KIND NAME MIN_NODES MAX_NODES MAX_MINUTES
-- (KIND: partition or qos), or `default_qos NAME` (the QOS of a job that names none). A job whose partition
-- or QOS has rules must fall into one rule's node range with a time limit within that rule's; a QOS no
-- rule names is refused when any rule names a QOS.

local rules = { partition = {}, qos = {} }
local default_qos = nil
for line in io.lines("@POLICY@") do
   local kind, name, low, high, minutes = line:match("^(%S+)%s+(%S+)%s+(%d+)%s+(%d+)%s+(%d+)")
   local default = line:match("^default_qos%s+(%S+)")
   if default then default_qos = default end
   if kind and rules[kind] then
      rules[kind][name] = rules[kind][name] or {}
      table.insert(rules[kind][name], { low = tonumber(low), high = tonumber(high), minutes = tonumber(minutes) })
   end
end

local function describe(list)
   local parts = {}
   for _, r in ipairs(list) do
      table.insert(parts, string.format("%d-%d nodes up to %d min", r.low, r.high, r.minutes))
   end
   return table.concat(parts, ", ")
end

local function check(kind, name, nodes, minutes)
   local list = rules[kind][name]
   if not list then
      if kind == "qos" and next(rules.qos) then
         return string.format("qos %s does not exist here (site policy)", name)
      end
      return nil
   end
   for _, r in ipairs(list) do
      if nodes >= r.low and nodes <= r.high and (minutes == nil or minutes <= r.minutes) then
         return nil
      end
   end
   return string.format("%s %s takes %s, not %d nodes for %s min (site policy)", kind, name, describe(list),
                        nodes, minutes and tostring(minutes) or "the default time")
end

function slurm_job_submit(job_desc, part_list, submit_uid)
   local nodes = job_desc.min_nodes
   if nodes == nil or nodes >= slurm.NO_VAL then nodes = 1 end
   local minutes = job_desc.time_limit
   if minutes ~= nil and minutes >= slurm.NO_VAL then minutes = nil end
   for _, kind in ipairs({ "partition", "qos" }) do
      local names = job_desc[kind]
      if kind == "qos" and names == nil then names = default_qos end
      if names ~= nil then
         for name in string.gmatch(names, "[^,]+") do
            local refused = check(kind, name, nodes, minutes)
            if refused then
               slurm.log_user("%s", refused)
               return slurm.ERROR
            end
         end
      end
   end
   return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
   return slurm.SUCCESS
end
