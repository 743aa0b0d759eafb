#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/encoding.h"
#include "common/result.h"
#include "common/sse.h"
#include "common/unique_fd.h"

// What the moatd client commands (`moat env`, `moat exec`) share: finding
// moatd and its token, a small synchronous HTTP/1.1 client, moatd's error
// format, and strict flag parsing in the style of `moat run`.
namespace moat::cli {

// Where moatd listens: "unix:/path/to.sock" or "http://HOST:PORT".
struct Endpoint {
  enum class Transport { kUnix, kTcp };
  Transport transport = Transport::kUnix;
  std::string path;  // kUnix
  std::string host;  // kTcp, without brackets for IPv6
  uint16_t port = 0;
  std::string display() const;  // as the user would write it
};

Result<Endpoint> parseEndpoint(const std::string& url);

struct HttpReply {
  int status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // moatd's own (X-Moat-...), names in lower case
};

// Where the user's own API key is kept: $XDG_CONFIG_HOME/moat/token, else
// $HOME/.config/moat/token ("" with neither).
std::string userTokenPath();

// Flags every client command takes (--url, --state, --token); empty means
// "not given", and the environment variables and defaults apply.
struct ConnectionOptions {
  std::string url;
  std::string stateDir;
  std::string token;
};

// One request per connection: moatd is local or near, and the CLI makes one
// or a few calls per run.
class Client {
 public:
  // --url, else $MOAT_URL, else unix:<state>/moatd.sock; --token, else
  // $MOAT_TOKEN, else <state>/master-token; state is --state, else
  // $MOAT_STATE, else /var/lib/moat. A missing token is reported by the
  // first request, after moatd was reached (an absent daemon is the more
  // useful error).
  static Result<Client> fromOptions(const ConnectionOptions& options);

  Client(Endpoint endpoint, Result<std::string> token);
  Result<HttpReply> request(const std::string& method, const std::string& target, const std::string& body = "");
  // GET `target` and hand the body to `onData` piece by piece as it arrives
  // (a stream that stays open: moat events --follow); `onData` returning
  // false ends it. An answer other than 200 comes back whole in the reply's
  // body. A connection lost mid-stream is an error with code "io".
  Result<HttpReply> stream(const std::string& target, const std::function<bool(const std::string&)>& onData);
  // Opens a WebSocket on `target` (moatd answers 101): the connected socket
  // and the bytes already read past the handshake. A refusal comes back as
  // an error carrying moatd's message.
  struct Upgraded {
    UniqueFd fd;
    std::string pending;
  };
  Result<Upgraded> openWebSocket(const std::string& target);
  const Endpoint& endpoint() const { return endpoint_; }

 private:
  Endpoint endpoint_;
  Result<std::string> token_;
};

// Calls moatd; an answer other than `expect` is an error carrying moatd's
// message. The JSON answer (null for an empty body).
Result<nlohmann::json> call(Client& client, const std::string& method, const std::string& target,
                            const std::string& body, int expect);
// `moat X rm A B ...`: DELETE each one's path (204 expected) and print its
// name; one that fails is reported (as `command`) and the rest still go.
// The exit code: the last failure's, else 0.
int deleteEach(Client& client, const std::string& command, const std::vector<std::string>& names,
               const std::function<Result<std::string>(const std::string&)>& pathOf);

// moatd's {"error":{"code","message","field"}} as one line:
// "<message> (<code>[, field <field>])".
std::string describeError(const HttpReply& reply);

// Percent-encoding for a path segment or a query value.
std::string urlEncode(const std::string& s);

// Strict flag parsing: "--flag value", "--flag=value", "-f value". Errors
// have code "usage" and name the flag.
//
// Why not CLI11 (Debian's libcli11-dev): this reader is the only part of
// the CLI's parsing that CLI11 would replace. What remains either way is
// per flag: its check and a message in the CLI's words (parseNumber,
// parseLabel, parsePermissionsFlag, the network and secret readers shared by
// `env create`, `run` and `env network`), the usage texts written with
// examples, and exit code 2 for every usage error (cli/exit_codes.h), which
// CLI11 would need a validator, a custom message and a failure handler per
// command to say the same. tests/integration/cli_test.cc pins the messages.
class FlagReader {
 public:
  explicit FlagReader(const std::vector<std::string>& args) : args_(args) {}

  bool done() const { return index_ >= args_.size(); }
  const std::string& current() const { return args_[index_]; }
  bool currentIsFlag() const;  // starts with '-' and is not "-" or "--"
  // Reads the flag at the cursor and moves past it; name() and value() then
  // describe it. "--flag=" (an empty inline value) is an error.
  Status next();
  const std::string& name() const { return name_; }
  // The flag's value: inline, or the following argument.
  Result<std::string> value();
  Status noValue() const;    // an error if the flag was written with =value
  void skip() { ++index_; }  // moves past a positional argument
  std::vector<std::string> rest() const;

 private:
  const std::vector<std::string>& args_;
  size_t index_ = 0;
  std::string name_;
  std::string inlineValue_;
  bool hasInline_ = false;
};

Error usageError(const std::string& message);
// "unknown option NAME", with the option meant where NAME is a usual slip
// (--cpu for --cpus, --mem for --memory...).
Error unknownOption(const std::string& name);

// The flag loop of the moatd client subcommands: connection flags, --json
// and -h are common; `handle` takes the subcommand's own flags (setting
// `matched`); everything else that is not a flag is positional.
struct Parsed {
  ConnectionOptions connection;
  std::vector<std::string> positional;
  bool json = false;
  bool help = false;
};
Status parseArgs(const std::vector<std::string>& args, Parsed& out,
                 const std::function<Status(FlagReader&, bool&)>& handle);

// A client command on the one resource its only argument names ("moat env
// get ID", "moat agent stop ID"): its flags parsed, the argument turned
// into a path by `pathOf` (an error is reported as it is), one request,
// --json printed. The answer; none once the command has ended, its exit
// code in `code` (usage errors, failures, --help, --json).
struct OneResource {
  std::string command;  // "env get": for messages
  std::string missing;  // the usage error without an argument
  std::string several;  // ... with more than one
  std::function<Result<std::string>(const std::string&)> pathOf;
  std::string method = "GET";
  std::function<int()> help;
};
std::optional<nlohmann::json> callOne(const std::vector<std::string>& args, const OneResource& what, Parsed& parsed,
                                      int& code);
// Handles --url, --state and --token; `matched` says whether the flag was one of them.
Status readConnectionFlag(FlagReader& flags, ConnectionOptions& options, bool& matched);
Result<double> parseNumber(const std::string& flag, const std::string& value);
Result<uint64_t> parseWhole(const std::string& flag, const std::string& value);
// NAME=VALUE; `-e NAME` alone copies the host's value (as `moat run` does).
Status parseVariable(const std::string& flag, const std::string& value, std::map<std::string, std::string>& out);
Status parseLabel(const std::string& flag, const std::string& value, std::map<std::string, std::string>& out);
// --permissions: JSON text, or @FILE holding it (docs/GATE.md).
Result<nlohmann::json> parsePermissionsFlag(const std::string& flag, const std::string& value);

// An environment id as a path segment; ids never contain '/'.
Result<std::string> environmentPath(const std::string& id);

// Writes all of `data` to fd; false when the reader is gone.
bool writeAll(int fd, const std::string& data);
// "moat: <message>" on stderr; returns `code`.
int complain(int code, const std::string& message);
// A failed client call: usage errors exit 2, everything else 125.
int reportFailure(const std::string& command, const Error& error);

const char* connectionUsage();

}  // namespace moat::cli
