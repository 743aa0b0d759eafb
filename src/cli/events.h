#pragma once

#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "cli/client.h"

// What `moat events` and `moat audit export` share: reading moatd's audit
// log (GET /v1/events) page by page or as a live stream.
namespace moat::cli {

struct EventsQuery {
  std::string environment;
  std::string typePrefix;
  uint64_t since = 0;  // events after this id
};

// The GET /v1/events target for `query`.
std::string eventsTarget(const EventsQuery& query, bool follow);

// Every matching event after query.since, page after page (moatd answers
// up to 1000 per request) until there are no more. `onEvent` gets each
// event's JSON (the SSE data line) and may stop the walk by returning false.
Status readEvents(Client& client, EventsQuery query,
                  const std::function<bool(const nlohmann::json& event, const std::string& line)>& onEvent);

}  // namespace moat::cli
