#include "cli/run_options.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include "common/base_environment.h"
#include "os/file.h"

namespace moat::cli {
namespace {

constexpr uint64_t kHostMb = 8192;

const char* fakeHostEnv(const char* name) {
  if (std::string(name) == "API_TOKEN") return "s3cret=with=equals";
  if (std::string(name) == "EMPTY") return "";
  return nullptr;
}

Result<RunOptions> parse(const std::vector<std::string>& args) { return parseRunOptions(args, kHostMb, fakeHostEnv); }

// Sets or unsets MOAT_STATE for one test and restores it afterwards.
class ScopedStateEnv {
 public:
  explicit ScopedStateEnv(const char* value) {
    const char* old = ::getenv("MOAT_STATE");
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) {
      ::setenv("MOAT_STATE", value, 1);
    } else {
      ::unsetenv("MOAT_STATE");
    }
  }
  ~ScopedStateEnv() {
    if (had_) {
      ::setenv("MOAT_STATE", old_.c_str(), 1);
    } else {
      ::unsetenv("MOAT_STATE");
    }
  }

 private:
  bool had_ = false;
  std::string old_;
};

// Expects a usage error whose text contains every one of `needles`.
void expectError(const std::vector<std::string>& args, const std::vector<std::string>& needles) {
  std::string joined;
  for (const auto& a : args) joined += a + " ";
  auto r = parse(args);
  ASSERT_FALSE(r.ok()) << "accepted: " << joined;
  EXPECT_EQ(r.error().code, Code::kUsage) << joined;
  for (const auto& n : needles) {
    EXPECT_NE(r.error().context.find(n), std::string::npos)
        << joined << "-> '" << r.error().context << "' does not mention '" << n << "'";
  }
}

TEST(RunOptions, Defaults) {
  ScopedStateEnv env(nullptr);
  auto r = parse({"true"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->spec.cpus, 1.0);
  EXPECT_EQ(r->spec.memoryMb, 1024u);
  EXPECT_EQ(r->spec.pids, 1024u);
  EXPECT_EQ(r->spec.storageGb, 4u);
  EXPECT_EQ(r->spec.templateName, "host");
  EXPECT_EQ(r->spec.stateDir, "/var/lib/moat");
  EXPECT_TRUE(r->spec.volumes.empty());
  EXPECT_EQ(r->workdir, "/workspace");
  EXPECT_EQ(r->timeoutSeconds, 0.0);
  EXPECT_FALSE(r->interactive);
  EXPECT_FALSE(r->help);
  EXPECT_FALSE(r->microvm) << "namespaces unless --isolation microvm";
  EXPECT_TRUE(r->env.empty());
  EXPECT_EQ(r->command, std::vector<std::string>{"true"});
}

TEST(RunOptions, IsolationIsNamespacesOrMicrovm) {
  auto vm = parse({"--isolation", "microvm", "true"});
  ASSERT_TRUE(vm.ok());
  EXPECT_TRUE(vm->microvm);
  auto ns = parse({"--isolation=namespaces", "true"});
  ASSERT_TRUE(ns.ok());
  EXPECT_FALSE(ns->microvm);
  expectError({"--isolation", "kvm", "true"}, {"--isolation", "'kvm'", "namespaces, microvm"});
  expectError({"--isolation"}, {"--isolation"});
}

TEST(RunOptions, StateDirFromEnvironment) {
  {
    ScopedStateEnv env("/srv/moat-state");
    auto r = parse({"true"});
    ASSERT_TRUE(r.ok()) << r.error().message();
    EXPECT_EQ(r->spec.stateDir, "/srv/moat-state");
    // --state wins over MOAT_STATE.
    auto s = parse({"--state", "/x/y/", "true"});
    ASSERT_TRUE(s.ok()) << s.error().message();
    EXPECT_EQ(s->spec.stateDir, "/x/y");
  }
  {
    ScopedStateEnv env("");  // empty counts as unset
    auto r = parse({"true"});
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(r->spec.stateDir, "/var/lib/moat");
  }
}

TEST(RunOptions, EveryFlagSeparateValue) {
  ScopedStateEnv env(nullptr);
  auto r = parse({"--cpus",     "2.5",         "--memory",      "2048",        "--pids",  "100", "--storage",
                  "10",         "--timeout",   "1.5",           "-i",          "-e",      "A=1", "--env",
                  "B=2",        "-v",          "/tmp:/data:ro", "--volume",    "/:/host", "-w",  "/src",
                  "--template", "/srv/rootfs", "--state",       "/var/tmp/st", "cmd",     "arg"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->spec.cpus, 2.5);
  EXPECT_EQ(r->spec.memoryMb, 2048u);
  EXPECT_EQ(r->spec.pids, 100u);
  EXPECT_EQ(r->spec.storageGb, 10u);
  EXPECT_EQ(r->timeoutSeconds, 1.5);
  EXPECT_TRUE(r->interactive);
  EXPECT_EQ(r->env, (std::vector<std::string>{"A=1", "B=2"}));
  ASSERT_EQ(r->spec.volumes.size(), 2u);
  EXPECT_EQ(r->spec.volumes[0].source, "/tmp");
  EXPECT_EQ(r->spec.volumes[0].target, "/data");
  EXPECT_TRUE(r->spec.volumes[0].readOnly);
  EXPECT_EQ(r->spec.volumes[1].source, "/");
  EXPECT_EQ(r->spec.volumes[1].target, "/host");
  EXPECT_FALSE(r->spec.volumes[1].readOnly);
  EXPECT_EQ(r->workdir, "/src");
  EXPECT_EQ(r->spec.templateName, "/srv/rootfs");
  EXPECT_EQ(r->spec.stateDir, "/var/tmp/st");
  EXPECT_EQ(r->command, (std::vector<std::string>{"cmd", "arg"}));
}

TEST(RunOptions, EveryLongFlagWithEquals) {
  auto r =
      parse({"--cpus=0.5", "--memory=64", "--pids=4", "--storage=1", "--timeout=30", "--interactive", "--env=A=x=y",
             "--volume=/tmp:/data:rw", "--workdir=/a/./b/", "--template=host", "--state=/st", "cmd"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->spec.cpus, 0.5);
  EXPECT_EQ(r->spec.memoryMb, 64u);
  EXPECT_EQ(r->spec.pids, 4u);
  EXPECT_EQ(r->spec.storageGb, 1u);
  EXPECT_EQ(r->timeoutSeconds, 30.0);
  EXPECT_TRUE(r->interactive);
  EXPECT_EQ(r->env, std::vector<std::string>{"A=x=y"});
  ASSERT_EQ(r->spec.volumes.size(), 1u);
  EXPECT_EQ(r->spec.volumes[0].target, "/data");
  EXPECT_FALSE(r->spec.volumes[0].readOnly);
  EXPECT_EQ(r->workdir, "/a/b");
  EXPECT_EQ(r->spec.templateName, "host");
  EXPECT_EQ(r->spec.stateDir, "/st");
  EXPECT_EQ(r->command, std::vector<std::string>{"cmd"});
}

TEST(RunOptions, EqualsWithEmptyValueNamesFlag) {
  expectError({"--memory=", "cmd"}, {"--memory", "needs a value"});
  expectError(
      {
          "--cpus",
      },
      {"--cpus", "needs a value"});
}

TEST(RunOptions, DoubleDashSeparator) {
  auto r = parse({"--cpus", "2", "--", "--memory", "-x"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->spec.cpus, 2.0);
  EXPECT_EQ(r->spec.memoryMb, 1024u) << "--memory after -- belongs to the command";
  EXPECT_EQ(r->command, (std::vector<std::string>{"--memory", "-x"}));
  expectError({"--cpus", "2", "--"}, {"missing command"});
}

TEST(RunOptions, OptionsAfterTheCommandBelongToIt) {
  auto r = parse({"ls", "-la", "--cpus", "9", "--"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->command, (std::vector<std::string>{"ls", "-la", "--cpus", "9", "--"}));
  EXPECT_EQ(r->spec.cpus, 1.0);
}

TEST(RunOptions, Help) {
  auto r = parse({"--help"});
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->help);
  auto h = parse({"-h", "--bogus"});
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->help);
  EXPECT_NE(std::string(runUsage()).find("--memory"), std::string::npos);
}

TEST(RunOptions, UnknownOption) { expectError({"--frobnicate", "ls"}, {"unknown option", "--frobnicate"}); }

TEST(RunOptions, UnknownShortOption) { expectError({"-x", "ls"}, {"unknown option", "-x"}); }

TEST(RunOptions, MissingCommand) {
  expectError({}, {"missing command"});
  expectError({"--cpus", "2"}, {"missing command"});
}

TEST(RunOptions, MemoryBounds) {
  expectError({"--memory", "0", "ls"}, {"--memory", "0", "out of range"});
  expectError({"--memory", "8193", "ls"}, {"--memory", "8193", "out of range"});
  expectError({"--memory", "1.5", "ls"}, {"--memory", "not a whole number"});
  expectError({"--memory", "-5", "ls"}, {"--memory"});
  expectError({"--memory", "99999999999999999999", "ls"}, {"--memory", "out of range"});
  auto atHost = parse({"--memory", "8192", "ls"});
  ASSERT_TRUE(atHost.ok()) << atHost.error().message();
  EXPECT_EQ(atHost->spec.memoryMb, 8192u);
  // The bound is the host's memory as passed in.
  auto small = parseRunOptions({"--memory", "600", "ls"}, 512, fakeHostEnv);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.error().context.find("512"), std::string::npos) << small.error().context;
}

TEST(RunOptions, CpusBounds) {
  expectError({"--cpus", "0", "ls"}, {"--cpus", "out of range"});
  expectError({"--cpus", "abc", "ls"}, {"--cpus", "'abc'", "not a number"});
  expectError({"--cpus", "-1", "ls"}, {"--cpus", "out of range"});
  expectError({"--cpus", "nan", "ls"}, {"--cpus"});
  expectError({"--cpus", "inf", "ls"}, {"--cpus"});
  expectError({"--cpus", "2x", "ls"}, {"--cpus", "not a number"});
  expectError({"--cpus", "1025", "ls"}, {"--cpus", "out of range"});
}

TEST(RunOptions, PidsStorageTimeoutBounds) {
  expectError({"--pids", "1", "ls"}, {"--pids", "out of range"});
  expectError({"--pids", "abc", "ls"}, {"--pids"});
  expectError({"--storage", "0", "ls"}, {"--storage", "out of range"});
  expectError({"--timeout", "0", "ls"}, {"--timeout", "out of range"});
  expectError({"--timeout", "-1", "ls"}, {"--timeout", "out of range"});
  expectError({"--timeout", "soon", "ls"}, {"--timeout", "not a number"});
  auto ok = parse({"--timeout", "0.25", "ls"});
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->timeoutSeconds, 0.25);
}

TEST(RunOptions, VolumeErrors) {
  expectError({"-v", "/tmp", "ls"}, {"-v", "HOST_PATH:ENV_PATH"});
  expectError({"-v", ":/data", "ls"}, {"-v"});
  expectError({"-v", "/tmp:", "ls"}, {"-v"});
  expectError({"-v", "/tmp:/a:ro:x", "ls"}, {"-v"});
  expectError({"-v", "/nonexistent/moat-test-path:/data", "ls"},
              {"-v", "/nonexistent/moat-test-path", "does not exist"});
  expectError({"-v", "/tmp:data", "ls"}, {"-v", "absolute"});
  expectError({"-v", "/tmp:/proc", "ls"}, {"-v", "reserved"});
  expectError({"-v", "/tmp:/proc/sys", "ls"}, {"-v", "reserved"});
  expectError({"-v", "/tmp:/", "ls"}, {"-v", "reserved"});
  expectError({"-v", "/tmp:/dev/x", "ls"}, {"-v", "reserved"});
  expectError({"-v", "/tmp:/sys", "ls"}, {"-v", "reserved"});
  expectError({"-v", "/tmp:/data/../etc", "ls"}, {"-v", ".."});
  expectError({"-v", "/tmp:/data/./x", "ls"}, {"-v"});
  expectError({"-v", "/tmp:/data:rx", "ls"}, {"-v", "ro or rw", "rx"});
  expectError({"--volume", "/tmp:/data:RO", "ls"}, {"-v", "ro or rw"});
}

TEST(RunOptions, VolumeSourceIsKeptAsNamed) {
  // Not canonicalised: the environment is made from the path as named,
  // following only root's symlinks (os::openHostPath). A /devices target
  // is not /dev; its trailing slash is normalised.
  auto r = parse({"-v", "/tmp/../tmp/:/devices/", "ls"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  ASSERT_EQ(r->spec.volumes.size(), 1u);
  EXPECT_EQ(r->spec.volumes[0].source, "/tmp/../tmp/");
  EXPECT_EQ(r->spec.volumes[0].target, "/devices");
  // A relative source is taken from the current directory.
  auto relative = parse({"-v", ".:/here", "ls"});
  ASSERT_TRUE(relative.ok()) << relative.error().message();
  EXPECT_EQ(relative->spec.volumes[0].source, os::joinPath(os::currentDirectory().value(), "."));
}

TEST(RunOptions, EnvErrors) {
  expectError({"-e", "1ABC=x", "ls"}, {"-e", "'1ABC'", "not a valid"});
  expectError({"-e", "A-B=x", "ls"}, {"-e", "not a valid"});
  expectError({"-e", "=x", "ls"}, {"-e", "not a valid"});
  expectError({"-e", "NOT_SET_ANYWHERE", "ls"}, {"-e", "NOT_SET_ANYWHERE", "not set"});
  expectError({"-e"}, {"-e", "needs a value"});
}

TEST(RunOptions, EnvCopiesNamedHostVariable) {
  auto r = parse({"-e", "API_TOKEN", "-e", "EMPTY", "-e", "X=", "ls"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->env, (std::vector<std::string>{"API_TOKEN=s3cret=with=equals", "EMPTY=", "X="}));
  // Without a lookup function nothing can be copied.
  auto none = parseRunOptions({"-e", "API_TOKEN", "ls"}, kHostMb, nullptr);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.error().context.find("API_TOKEN"), std::string::npos);
}

TEST(RunOptions, WorkdirMustBeAbsolute) {
  expectError({"-w", "rel/dir", "ls"}, {"-w", "absolute", "rel/dir"});
  expectError({"--workdir=x", "ls"}, {"-w", "absolute"});
  auto r = parse({"-w", "/a//b/../c", "ls"});
  ASSERT_TRUE(r.ok()) << r.error().message();
  EXPECT_EQ(r->workdir, "/a/c");
}

TEST(RunOptions, StateMustBeAbsolute) { expectError({"--state", "rel", "ls"}, {"--state", "absolute"}); }

TEST(RunOptions, FlagWithoutValueRejectsInlineValue) {
  // "--interactive=no" must not silently mean "interactive".
  auto r = parse({"--interactive=no", "ls"});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().context.find("--interactive"), std::string::npos) << r.error().context;
}

TEST(RunOptions, BaseEnvironmentHasNothingFromTheHost) {
  ::setenv("MOAT_UNIT_TEST_LEAK", "leaked-value", 1);
  auto env = baseEnvironment("envhost", "/workspace");
  ::unsetenv("MOAT_UNIT_TEST_LEAK");
  std::set<std::string> keys;
  for (const auto& e : env) {
    auto eq = e.find('=');
    ASSERT_NE(eq, std::string::npos) << e;
    EXPECT_TRUE(keys.insert(e.substr(0, eq)).second) << "duplicate " << e;
    EXPECT_EQ(e.find("leaked-value"), std::string::npos) << e;
  }
  auto has = [&](const std::string& entry) {
    for (const auto& e : env) {
      if (e == entry) return true;
    }
    return false;
  };
  EXPECT_TRUE(keys.count("PATH"));
  EXPECT_TRUE(has("HOME=/root"));
  EXPECT_TRUE(keys.count("LANG"));
  EXPECT_TRUE(keys.count("TERM"));
  EXPECT_TRUE(has("HOSTNAME=envhost"));
  EXPECT_TRUE(has("PWD=/workspace"));
  const std::set<std::string> allowed = {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TERM", "HOSTNAME", "PWD"};
  for (const auto& k : keys) EXPECT_TRUE(allowed.count(k)) << "unexpected variable " << k;
  EXPECT_FALSE(keys.count("MOAT_UNIT_TEST_LEAK"));
}

}  // namespace
}  // namespace moat::cli
