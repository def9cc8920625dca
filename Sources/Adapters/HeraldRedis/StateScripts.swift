/// The Lua scripts, run with EVAL (Redis runs a script atomically).
enum Scripts {
    /// KEYS: the owner key. ARGV: user. Deletes the key when it still names that user.
    static let releaseOwner = """
        if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
        return 0
        """

    /// Lua helpers over a user's state hash (`UserRecord`), put in front of the scripts that change devices or
    /// presence. `devices(key)`: the `d` field's lines as {line, token, at, kind} (a line that does not decode has
    /// token nil, `registered_at` 0 and kind `apns`); `put_devices(key, list)` writes them back (or deletes the
    /// field when none are left); `drop_online(key, gone, now)` removes the `o` lines of the tokens in the set
    /// `gone` and, with `now`, those expired at `now`.
    static let userHelpers = """
        local function devices(key)
          local out = {}
          local raw = redis.call('HGET', key, 'd')
          if not raw then return out end
          for line in string.gmatch(raw, '[^\\n]+') do
            local entry = {line = line, at = 0, kind = 'apns'}
            local ok, device = pcall(cjson.decode, line)
            if ok and type(device) == 'table' then
              if type(device['token']) == 'string' then entry.token = device['token'] end
              if tonumber(device['registered_at']) then entry.at = tonumber(device['registered_at']) end
              if type(device['kind']) == 'string' then entry.kind = device['kind'] end
            end
            out[#out + 1] = entry
          end
          return out
        end
        local function put_devices(key, list)
          local lines = {}
          for _, entry in ipairs(list) do lines[#lines + 1] = entry.line end
          if #lines == 0 then redis.call('HDEL', key, 'd') else redis.call('HSET', key, 'd', table.concat(lines, '\\n')) end
        end
        local function drop_online(key, gone, now)
          local raw = redis.call('HGET', key, 'o')
          if not raw then return end
          local kept = {}
          for line in string.gmatch(raw, '[^\\n]+') do
            local expiry, token = string.match(line, '^(%d+) (.*)$')
            local live = expiry ~= nil and not gone[token] and (now == nil or tonumber(expiry) > now)
            if live then kept[#kept + 1] = line end
          end
          if #kept == 0 then redis.call('HDEL', key, 'o') else redis.call('HSET', key, 'o', table.concat(kept, '\\n')) end
        end

        """

    /// KEYS: the user's state hash. ARGV: token, device JSON, max devices per kind, the device's kind, unique (1:
    /// remove every other device of that kind), the device's `registered_at`. The entry replaces the token's
    /// earlier one; a stored line that does not decode is dropped. Returns the evicted tokens.
    static let register =
        userHelpers + """
            local max = tonumber(ARGV[3])
            local unique = ARGV[5] == '1'
            local list = {}
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token ~= nil and entry.token ~= ARGV[1] then list[#list + 1] = entry end
            end
            list[#list + 1] = {line = ARGV[2], token = ARGV[1], at = tonumber(ARGV[6]) or 0, kind = ARGV[4], newest = 1}
            local same = {}
            for _, entry in ipairs(list) do
              if entry.kind == ARGV[4] and not (unique and entry.newest == 1) then same[#same + 1] = entry end
            end
            if unique then max = 0 end
            local evicted = {}
            if #same > max then
              table.sort(same, function(a, b)
                if a.at ~= b.at then return a.at < b.at end
                if (a.newest or 0) ~= (b.newest or 0) then return (a.newest or 0) < (b.newest or 0) end
                return a.token < b.token
              end)
              local gone = {}
              for i = 1, #same - max do
                gone[same[i].token] = true
                evicted[#evicted + 1] = same[i].token
              end
              local kept = {}
              for _, entry in ipairs(list) do
                if not gone[entry.token] then kept[#kept + 1] = entry end
              end
              list = kept
              drop_online(KEYS[1], gone, nil)
            end
            put_devices(KEYS[1], list)
            return evicted
            """

    /// KEYS: the user's state hash. ARGV: token. Removes the device and its presence line. Returns 1 when the
    /// device was registered, else 0.
    static let unregister =
        userHelpers + """
            local list = {}
            local found = 0
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token == ARGV[1] then found = 1 else list[#list + 1] = entry end
            end
            if found == 1 then put_devices(KEYS[1], list) end
            drop_online(KEYS[1], {[ARGV[1]] = true}, nil)
            return found
            """

    /// KEYS: the user's state hash. Removes every device and the presence; returns the devices' tokens.
    static let unregisterAll =
        userHelpers + """
            local tokens = {}
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token ~= nil then tokens[#tokens + 1] = entry.token end
            end
            redis.call('HDEL', KEYS[1], 'd', 'o')
            return tokens
            """

    /// KEYS: the user's state hash. ARGV: token, dead-since (ms).
    /// Returns 1 removed, -1 kept (registered after dead-since), 0 not registered.
    static let removeDead =
        userHelpers + """
            local list = {}
            local found = nil
            for _, entry in ipairs(devices(KEYS[1])) do
              if entry.token == ARGV[1] then found = entry else list[#list + 1] = entry end
            end
            if found == nil then return 0 end
            if found.at > tonumber(ARGV[2]) then return -1 end
            put_devices(KEYS[1], list)
            drop_online(KEYS[1], {[ARGV[1]] = true}, nil)
            return 1
            """

    /// KEYS: the user's state hash. ARGV: token, its new expiry (ms; 0: offline), now (ms). Lines expired at now
    /// are dropped too.
    static let devicePresence =
        userHelpers + """
            drop_online(KEYS[1], {[ARGV[1]] = true}, tonumber(ARGV[3]))
            if ARGV[2] ~= '0' then
              local raw = redis.call('HGET', KEYS[1], 'o')
              local line = ARGV[2] .. ' ' .. ARGV[1]
              if raw then line = raw .. '\\n' .. line end
              redis.call('HSET', KEYS[1], 'o', line)
            end
            return 1
            """

    /// KEYS: the user's state hash. ARGV: field, count pairs. The `total` and `c:` fields are replaced by these.
    static let replaceCounts =
        CountScripts.dropCounts + """
            drop_counts(KEYS[1])
            redis.call('HSET', KEYS[1], unpack(ARGV))
            return 1
            """
}
