#pragma once

#include <string>

#include "common/result.h"

namespace moat::api {

// The master token: generated on first start into <state>/master-token
// (0600, 64 hex digits) and read back on later starts.
Result<std::string> loadOrCreateMasterToken(const std::string& stateDir);

// Compares in time independent of where the strings differ.
bool constantTimeEquals(const std::string& a, const std::string& b);

// "Bearer <token>" -> token; empty when the header has another form.
std::string bearerToken(const std::string& authorization);

}  // namespace moat::api
