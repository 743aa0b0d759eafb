// moatd's command line: each flag sets what it names, values out of range
// and unknown arguments are refused by name, and nothing else changes.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "daemon/flags.h"

namespace moat::daemon {
namespace {

Result<DaemonFlags> parse(std::vector<std::string> args) { return parseDaemonFlags(args, "/var/lib/moat", 8192); }

std::string problem(std::vector<std::string> args) {
  auto f = parse(std::move(args));
  return f.ok() ? "accepted" : std::string(codeName(f.error().code)) + ": " + f.error().context;
}

TEST(DaemonFlags, NoArgumentsAreTheDefaults) {
  auto f = parse({});
  ASSERT_TRUE(f.ok());
  DaemonFlags defaults;
  EXPECT_EQ(f->stateDir, "/var/lib/moat");
  EXPECT_EQ(f->listen, "127.0.0.1:7070");
  EXPECT_EQ(f->approvalTimeoutS, 120);
  EXPECT_EQ(f->keyRate, 200u);
  EXPECT_TRUE(f->egressOn);
  EXPECT_FALSE(f->help);
  EXPECT_EQ(f->manager.maxEnvironments, defaults.manager.maxEnvironments);
  EXPECT_TRUE(f->manager.warmPools.empty());
  EXPECT_EQ(f->server.maxConnections, defaults.server.maxConnections);
  EXPECT_EQ(f->audit.maxEvents, defaults.audit.maxEvents);
}

TEST(DaemonFlags, EachFlagSetsWhatItNames) {
  auto f = parse({"--state",
                  "/srv/moat",
                  "--listen",
                  "0.0.0.0:8080",
                  "--warm-pool",
                  "2:ram_mb=512",
                  "--warm-pool",
                  "1",
                  "--max-environments",
                  "10",
                  "--max-connections",
                  "20",
                  "--key-rate",
                  "0",
                  "--approval-timeout",
                  "30",
                  "--lossless-wait",
                  "5",
                  "--back-to-disk-after",
                  "9",
                  "--audit-retention-days",
                  "0",
                  "--audit-max-events",
                  "5000",
                  "--egress-head-timeout",
                  "7",
                  "--agent-key-tokens",
                  "100000",
                  "--agent-local-providers",
                  "--board-dir",
                  "/tmp",
                  "--no-egress"});
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->stateDir, "/srv/moat");
  EXPECT_EQ(f->listen, "0.0.0.0:8080");
  ASSERT_EQ(f->manager.warmPools.size(), 2u);
  EXPECT_EQ(f->manager.warmPools[0].size, 2u);
  EXPECT_EQ(f->manager.warmPools[0].ramMb, 512u);
  EXPECT_EQ(f->manager.warmPools[1].size, 1u);
  EXPECT_EQ(f->manager.maxEnvironments, 10u);
  EXPECT_EQ(f->server.maxConnections, 20u);
  EXPECT_EQ(f->keyRate, 0u);
  EXPECT_EQ(f->approvalTimeoutS, 30);
  EXPECT_EQ(f->manager.processLimits.losslessWaitMs, 5000);
  EXPECT_EQ(f->manager.backToDiskAfterMs, 9000);
  EXPECT_EQ(f->audit.retentionDays, 0);
  EXPECT_EQ(f->audit.maxEvents, 5000u);
  EXPECT_EQ(f->egress.headTimeout, std::chrono::seconds(7));
  EXPECT_FALSE(f->egressOn);
  EXPECT_EQ(f->agentKeyTokens, 100000u);
  EXPECT_TRUE(f->agentLocalProviders);
  EXPECT_EQ(f->boardDir, "/tmp");
  EXPECT_TRUE(f->board);
  auto none = parse({"--no-board"});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->board);
  EXPECT_EQ(none->previewDomain, "preview.localhost");
  EXPECT_EQ(none->portTimeoutS, 60);
  auto ports = parse({"--preview-domain", "preview.example.com", "--port-timeout", "5"});
  ASSERT_TRUE(ports.ok()) << ports.error().message();
  EXPECT_EQ(ports->previewDomain, "preview.example.com");
  EXPECT_EQ(ports->portTimeoutS, 5);
}

// Every host under the preview domain is a preview's: never one the API is
// reached by (localhost, an address), nor something that is not a name.
TEST(DaemonFlags, ThePreviewDomainIsALowercaseNameOfTwoLabelsOrMore) {
  for (const char* bad :
       {"localhost", "127.0.0.1", "Preview.localhost", ".preview.localhost", "preview..localhost", "a.b/c", "x."}) {
    EXPECT_EQ(problem({"--preview-domain", bad}).rfind("invalid_argument: --preview-domain", 0), 0u) << bad;
  }
  EXPECT_EQ(problem({"--port-timeout", "0"}),
            "invalid_argument: --port-timeout needs a number of seconds from 1 to 3600");
}

TEST(DaemonFlags, ValuesOutOfRangeAreRefusedByName) {
  EXPECT_EQ(problem({"--max-environments", "0"}),
            "invalid_argument: --max-environments needs a number from 1 to 100000");
  EXPECT_EQ(problem({"--max-environments", "100001"}),
            "invalid_argument: --max-environments needs a number from 1 to 100000");
  EXPECT_EQ(problem({"--max-connections", "-1"}),
            "invalid_argument: --max-connections needs a number from 1 to 100000");
  EXPECT_EQ(problem({"--key-rate", "1e3"}),
            "invalid_argument: --key-rate needs a number of requests per second from 0 (no limit) to 100000");
  EXPECT_EQ(problem({"--approval-timeout", "86401"}),
            "invalid_argument: --approval-timeout needs a number of seconds from 1 to 86400");
  EXPECT_EQ(problem({"--audit-max-events", "999"}),
            "invalid_argument: --audit-max-events needs 0 or a number from 1000 to 1000000000");
  EXPECT_EQ(problem({"--audit-max-events", "99999999999"}),
            "invalid_argument: --audit-max-events needs 0 or a number from 1000 to 1000000000");
  EXPECT_EQ(problem({"--agent-key-tokens", "-5"}),
            "invalid_argument: --agent-key-tokens needs a number of tokens from 0 to 10^12");
  EXPECT_EQ(problem({"--egress-head-timeout", ""}),
            "invalid_argument: --egress-head-timeout needs a number of seconds from 1 to 3600");
  EXPECT_EQ(problem({"--warm-pool", "2:ram_mb=99999"}).rfind("invalid_argument: --warm-pool needs ", 0), 0u);
  EXPECT_EQ(problem({"--board-dir", "/nonexistent/board"}),
            "invalid_argument: --board-dir: /nonexistent/board is not a directory");
  EXPECT_EQ(problem({"--egress-hosts", "/nonexistent/hosts"}),
            "invalid_argument: --egress-hosts: cannot read /nonexistent/hosts");
  EXPECT_EQ(problem({"--isolation", "vm"}), "invalid_argument: --isolation needs namespaces or microvm, not vm");
  EXPECT_EQ(problem({"--microvm-accel", "hvf"}), "invalid_argument: --microvm-accel needs auto, kvm or tcg, not hvf");
  EXPECT_EQ(problem({"--microvm-boot-wait", "0"}),
            "invalid_argument: --microvm-boot-wait needs a number of seconds from 1 to 3600");
  // A pool of microVMs (its own isolation, or the default) must be one a
  // create could make.
  EXPECT_EQ(problem({"--isolation", "microvm", "--warm-pool", "2"}),
            "invalid_argument: --warm-pool of microVMs needs template=DIR or a template's name (the host's own tree "
            "is not made into an image)");
  EXPECT_EQ(problem({"--warm-pool", "2:isolation=microvm"}),
            "invalid_argument: --warm-pool of microVMs needs template=DIR or a template's name (the host's own tree "
            "is not made into an image)");
  EXPECT_EQ(problem({"--warm-pool", "2:template=/tmp,isolation=microvm,ram_mb=64"}),
            "invalid_argument: --warm-pool of microVMs needs ram_mb of at least 128");
  EXPECT_EQ(problem({"--warm-pool", "2:template=/tmp,isolation=vm"}),
            "invalid_argument: --warm-pool needs isolation: must be \"namespaces\" or \"microvm\"");
}

TEST(DaemonFlags, IsolationAndAccelSetTheManagersDefaults) {
  auto f = parse({"--isolation", "microvm", "--microvm-accel", "kvm"});
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->manager.defaultIsolation, backend::Isolation::kMicroVm);
  EXPECT_EQ(f->manager.microvmAccel, "kvm");
  auto w = parse({"--microvm-boot-wait", "30"});
  ASSERT_TRUE(w.ok()) << w.error().message();
  EXPECT_EQ(w->microvmBootWaitS, 30);
  EXPECT_EQ(w->microvmSavedGuests, 8u);
  auto cold = parse({"--microvm-saved-guests", "0"});
  ASSERT_TRUE(cold.ok()) << cold.error().message();
  EXPECT_EQ(cold->microvmSavedGuests, 0u);
  EXPECT_EQ(problem({"--microvm-saved-guests", "65"}),
            "invalid_argument: --microvm-saved-guests needs a number from 0 to 64");
  auto pooled = parse(
      {"--isolation", "microvm", "--warm-pool", "2:template=/tmp,ram_mb=256", "--warm-pool", "1:isolation=namespaces"});
  ASSERT_TRUE(pooled.ok()) << pooled.error().message();
  ASSERT_EQ(pooled->manager.warmPools.size(), 2u);
  EXPECT_FALSE(pooled->manager.warmPools[0].isolation.has_value()) << "moatd's default, resolved by the manager";
  EXPECT_EQ(pooled->manager.warmPools[1].isolation, backend::Isolation::kNamespaces);
  auto d = parse({});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->manager.defaultIsolation, backend::Isolation::kNamespaces);
  EXPECT_EQ(d->manager.microvmAccel, "auto");
  EXPECT_EQ(d->microvmBootWaitS, 120);
}

TEST(DaemonFlags, UnknownArgumentsAndMissingValuesAreUsageErrors) {
  EXPECT_EQ(problem({"--sate", "/x"}), "usage: unknown argument --sate");
  EXPECT_EQ(problem({"--state"}), "usage: --state needs a value");
  EXPECT_EQ(problem({"--no-egress", "--warm-pool"}), "usage: --warm-pool needs a value");
  auto help = parse({"--listen", "x", "--help", "--whatever"});
  ASSERT_TRUE(help.ok());
  EXPECT_TRUE(help->help);
  EXPECT_NE(std::string(daemonUsage()).find("--warm-pool N[:SPEC]"), std::string::npos);
}

// What --help lists is what moatd takes: every flag in the usage text is
// known to the parser.
TEST(DaemonFlags, EveryFlagTheUsageListsIsKnown) {
  const std::string usage = daemonUsage();
  std::set<std::string> listed;
  for (size_t at = usage.find("--"); at != std::string::npos; at = usage.find("--", at + 2)) {
    size_t end = usage.find_first_not_of("abcdefghijklmnopqrstuvwxyz-", at + 2);
    listed.insert(usage.substr(at, end - at));
  }
  ASSERT_GE(listed.size(), 15u);
  for (const auto& flag : listed) {
    EXPECT_EQ(problem({flag}).find("unknown argument"), std::string::npos) << flag;
  }
}

TEST(DaemonFlags, PermissionsComeFromAJsonFileAndABadOneIsRefusedWithItsProblem) {
  char dir[] = "/tmp/moat-flags-test-XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string good = std::string(dir) + "/good.json", bad = std::string(dir) + "/bad.json",
                    wrong = std::string(dir) + "/wrong.json";
  std::ofstream(good) << R"({"run_command": "deny"})";
  std::ofstream(bad) << "{not json";
  std::ofstream(wrong) << R"({"run_command": "sometimes"})";
  auto f = parse({"--permissions", good});
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->manager.defaultPermissions.toJson()["run_command"], "deny");
  EXPECT_EQ(problem({"--permissions", bad}), "invalid_argument: --permissions: " + bad + " is not JSON");
  std::string why = problem({"--permissions", wrong});
  EXPECT_EQ(why.rfind("invalid_argument: --permissions: " + wrong + ": permissions.run_command: must be", 0), 0u)
      << why;
  EXPECT_EQ(
      problem({"--permissions", std::string(dir) + "/missing.json"}).rfind("invalid_argument: --permissions: ", 0), 0u);
  for (const auto& p : {good, bad, wrong}) ::unlink(p.c_str());
  ::rmdir(dir);
}

}  // namespace
}  // namespace moat::daemon

namespace moat::daemon {
namespace {

TEST(DaemonFlags, TemplateLimitsAreSetAndRangeChecked) {
  auto f = parse({"--template-max-bytes", "16777216", "--template-max-files", "100", "--template-timeout", "60"});
  ASSERT_TRUE(f.ok()) << f.error().message();
  EXPECT_EQ(f->templateLimits.maxBytes, 16777216u);
  EXPECT_EQ(f->templateLimits.maxEntries, 100u);
  EXPECT_EQ(f->templateLimits.timeout, std::chrono::seconds(60));
  EXPECT_EQ(parse({})->templateLimits.maxBytes, 8ull << 30);
  EXPECT_NE(problem({"--template-max-bytes", "1000"}).find("--template-max-bytes"), std::string::npos);
  EXPECT_NE(problem({"--template-max-files", "0"}).find("--template-max-files"), std::string::npos);
  EXPECT_NE(problem({"--template-timeout", "x"}).find("--template-timeout"), std::string::npos);
}

}  // namespace
}  // namespace moat::daemon
