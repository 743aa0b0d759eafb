#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/client.h"

// The flags that say an environment's network policy and secrets
// (docs/EGRESS.md), shared by `moat env create` and `moat env network`.
namespace moat::cli {

constexpr const char* kNetworkFlagsUsage =
    "      --network P       none, open, or a policy as JSON or @FILE (docs/EGRESS.md)\n"
    "      --allow HOST      allow a host (glob, host:port, address or range); repeatable\n"
    "      --deny HOST       refuse a host even in open mode; repeatable\n";

class NetworkFlags {
 public:
  // Reads the flag under the cursor if it is one of ours.
  Result<bool> read(FlagReader& flags);
  // The policy the flags make: nothing when none was given.
  Result<std::optional<nlohmann::json>> policy() const;

 private:
  std::optional<nlohmann::json> base_;
  std::vector<std::string> allow_, deny_;
};

// --secret NAME@HOST[,HOST...]: the value is the caller's environment
// variable NAME (never a command-line argument, which other users can
// read); --secret-header NAME=HEADER ("Authorization: Bearer {value}").
class SecretFlags {
 public:
  Result<bool> read(FlagReader& flags);
  Result<std::optional<nlohmann::json>> secrets() const;

 private:
  nlohmann::json secrets_ = nlohmann::json::array();
  std::vector<std::pair<std::string, std::string>> headers_;
};

}  // namespace moat::cli
