// moatd --socket-group and moat keys create --for-user (docs/INSTALL.md):
// a normal user in the group reaches moatd's socket with a key of their
// own; nobody else does, and nothing else of the state directory opens.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "moat_process.h"
#include "moatd_process.h"
#include "os/file.h"

namespace moat::test {
namespace {

using json = nlohmann::json;

// A group and two users made for one test (one in the group, one not),
// with homes of their own; removed at the end. Names no host has.
class TestUsers {
 public:
  TestUsers() {
    std::string tag = std::to_string(::getpid());
    group = "moatg" + tag;
    member = "moatm" + tag;
    stranger = "moats" + tag;
    ok_ = runProcess({"/usr/sbin/groupadd", group}).exitCode == 0 && add(member, true) && add(stranger, false);
  }
  ~TestUsers() {
    for (const std::string& user : {member, stranger}) {
      (void)runProcess({"/usr/sbin/userdel", user});
      (void)os::removeTree(home(user));
    }
    (void)runProcess({"/usr/sbin/groupdel", group});
  }
  bool ok() const { return ok_; }
  static std::string home(const std::string& user) { return "/tmp/" + user + "-home"; }

  std::string group, member, stranger;

 private:
  bool add(const std::string& user, bool inGroup) {
    std::vector<std::string> argv = {"/usr/sbin/useradd", "-M", "-d", home(user), "-s", "/bin/sh"};
    if (inGroup) argv.insert(argv.end(), {"-G", group});
    argv.push_back(user);
    if (runProcess(argv).exitCode != 0 || !os::makeDir(home(user), 0700).ok()) return false;
    return runProcess({"/bin/chown", user + ":", home(user)}).exitCode == 0;
  }
  bool ok_ = false;
};

class SocketGroup : public ::testing::Test {
 protected:
  void SetUp() override {
    MOAT_REQUIRE_ROOT();
    if (!os::exists("/usr/sbin/useradd") || !os::exists("/usr/bin/setpriv")) {
      GTEST_SKIP() << "needs useradd and setpriv (passwd, util-linux) to act as another user";
    }
    users_ = std::make_unique<TestUsers>();
    ASSERT_TRUE(users_->ok()) << "could not make the test's users";
    daemon_ = std::make_unique<Moatd>(std::vector<std::string>{"--socket-group", users_->group});
    // The moat binary where any user may run it (the build tree may not be).
    bin_ = "/tmp/moat-socket-group-" + std::to_string(::getpid());
    ASSERT_TRUE(os::makeDir(bin_, 0755).ok());
    ASSERT_EQ(runProcess({"/bin/cp", binDir() + "/moat", bin_ + "/moat"}).exitCode, 0);
  }
  void TearDown() override {
    daemon_.reset();
    if (!bin_.empty()) (void)os::removeTree(bin_);
    users_.reset();
  }
  // moat as root, on this test's moatd.
  ProcessResult asRoot(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {bin_ + "/moat"};
    argv.insert(argv.end(), args.begin(), args.end());
    return runProcess(argv, "", {{"MOAT_STATE", daemon_->stateDir()}});
  }
  // `argv` as `user` (uid, groups from /etc/group), with its own HOME.
  ProcessResult as(const std::string& user, const std::vector<std::string>& argv) {
    std::vector<std::string> full = {"/usr/bin/setpriv", "--reuid=" + user, "--regid=" + user,
                                     "--init-groups",    "--reset-env",     "--"};
    full.insert(full.end(), argv.begin(), argv.end());
    return runProcess(full, "", {{"MOAT_STATE", daemon_->stateDir()}});
  }
  ProcessResult moatAs(const std::string& user, const std::vector<std::string>& args) {
    std::vector<std::string> argv = {"/usr/bin/env", "MOAT_STATE=" + daemon_->stateDir(), bin_ + "/moat"};
    argv.insert(argv.end(), args.begin(), args.end());
    return as(user, argv);
  }

  std::unique_ptr<TestUsers> users_;
  std::unique_ptr<Moatd> daemon_;
  std::string bin_;
};

std::string describeRun(const ProcessResult& r) {
  return "exit " + std::to_string(r.exitCode) + ", stdout: " + r.out + ", stderr: " + r.err;
}

TEST_F(SocketGroup, AMemberWithAKeyOfTheirOwnUsesMoatAndNothingElseOfTheStateOpens) {
  const std::string state = daemon_->stateDir();
  struct stat st;
  ASSERT_EQ(::stat(state.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0710u);
  ASSERT_EQ(::stat((state + "/moatd.sock").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0660u);
  const gid_t group = st.st_gid;
  EXPECT_NE(group, 0u);

  // Before a key: the socket opens, the request is refused for want of one.
  auto keyless = moatAs(users_->member, {"env", "ls"});
  EXPECT_NE(keyless.exitCode, 0);
  EXPECT_NE(keyless.err.find("moat keys create --for-user"), std::string::npos) << describeRun(keyless);

  auto made = asRoot(
      {"keys", "create", "--for-user", users_->member, "--scope", "create", "--scope", "exec", "--scope", "read"});
  ASSERT_EQ(made.exitCode, 0) << describeRun(made);
  const std::string tokenFile = TestUsers::home(users_->member) + "/.config/moat/token";
  EXPECT_NE(made.out.find("saved to " + tokenFile), std::string::npos) << describeRun(made);
  EXPECT_EQ(made.out.find("moat_"), std::string::npos) << "the secret is not printed: " << made.out;
  EXPECT_EQ(made.err, "") << "a member needs no note";
  ASSERT_EQ(::stat(tokenFile.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  auto owner = as(users_->member, {"/usr/bin/id", "-u"});
  EXPECT_EQ(std::to_string(st.st_uid) + "\n", owner.out) << "written as the user";

  // The member creates and uses an environment with that key alone.
  auto created = moatAs(users_->member, {"env", "create"});
  ASSERT_EQ(created.exitCode, 0) << describeRun(created);
  std::string id = created.out.substr(0, 12);
  auto ran = moatAs(users_->member, {"exec", id, "--", "echo", "from a member"});
  EXPECT_EQ(ran.out, "from a member\n") << describeRun(ran);
  auto keys = asRoot({"keys", "ls"});
  EXPECT_NE(keys.out.find(users_->member), std::string::npos) << "the key is named for the user: " << keys.out;

  // Nothing else of the state directory opens or lists for the group.
  for (const std::string name : {"master-token", "moat.db", "moatd.lock", "spawner.sock", "egress/ca.key", "."}) {
    auto read = as(users_->member, {"/bin/cat", state + "/" + name});
    EXPECT_NE(read.exitCode, 0) << name << " opened for a member: " << describeRun(read);
  }
  auto list = as(users_->member, {"/bin/ls", state});
  EXPECT_NE(list.exitCode, 0) << "the state directory listed: " << list.out;

  // Root with the member's HOME (sudo -E) still acts as root: the master
  // token, not the member's key (keys ls needs the master token).
  auto rootWithTheirHome = runProcess({bin_ + "/moat", "keys", "ls"}, "",
                                      {{"MOAT_STATE", state}, {"HOME", TestUsers::home(users_->member)}});
  EXPECT_EQ(rootWithTheirHome.exitCode, 0) << describeRun(rootWithTheirHome);

  // A token file others may read is refused, not used; a re-issue makes a
  // new file of mode 0600 and revokes the key it replaces.
  ASSERT_EQ(::chmod(tokenFile.c_str(), 0644), 0);
  auto loose = moatAs(users_->member, {"env", "ls"});
  EXPECT_NE(loose.exitCode, 0);
  EXPECT_NE(loose.err.find("may be read by others"), std::string::npos) << describeRun(loose);
  auto oldRead = os::readFile(tokenFile);
  ASSERT_TRUE(oldRead.ok());
  std::string oldToken = oldRead.value();
  auto again = asRoot({"keys", "create", "--for-user", users_->member, "--scope", "read"});
  ASSERT_EQ(again.exitCode, 0) << describeRun(again);
  EXPECT_NE(again.out.find("revoked " + users_->member + "'s earlier key"), std::string::npos) << describeRun(again);
  ASSERT_EQ(::stat(tokenFile.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u) << "the new token went into a file others may read";
  oldToken.erase(oldToken.find_last_not_of('\n') + 1);
  auto withOld = runProcess({bin_ + "/moat", "env", "ls"}, "", {{"MOAT_STATE", state}, {"MOAT_TOKEN", oldToken}});
  EXPECT_NE(withOld.exitCode, 0) << "the replaced key still works: " << describeRun(withOld);
  EXPECT_EQ(moatAs(users_->member, {"env", "ls"}).exitCode, 0);

  // Not a regular file of the user's: a link, a FIFO (which would hang a
  // reader) are refused at once.
  ASSERT_EQ(::unlink(tokenFile.c_str()), 0);
  ASSERT_EQ(::mkfifo(tokenFile.c_str(), 0600), 0);
  ASSERT_EQ(::chown(tokenFile.c_str(), st.st_uid, st.st_gid), 0);
  auto fifo = moatAs(users_->member, {"env", "ls"});
  EXPECT_NE(fifo.exitCode, 0);
  EXPECT_NE(fifo.err.find("is not a regular file"), std::string::npos) << describeRun(fifo);
  ASSERT_EQ(::unlink(tokenFile.c_str()), 0);
  ASSERT_EQ(::symlink("/etc/hostname", tokenFile.c_str()), 0);
  auto link = moatAs(users_->member, {"env", "ls"});
  EXPECT_NE(link.exitCode, 0);
  EXPECT_EQ(link.err.find("moat_"), std::string::npos) << describeRun(link);
}

TEST_F(SocketGroup, AUserOutsideTheGroupIsToldWhatToDoAndALinkInTheirHomeLeadsNowhere) {
  auto outside = moatAs(users_->stranger, {"env", "ls"});
  EXPECT_NE(outside.exitCode, 0);
  EXPECT_NE(outside.err.find("Permission denied"), std::string::npos) << describeRun(outside);
  EXPECT_NE(outside.err.find("only root and the members of the group"), std::string::npos) << describeRun(outside);
  EXPECT_EQ(outside.err.find("is moatd running"), std::string::npos) << describeRun(outside);

  // The user planted ~/.config -> /etc: root's write as that user fails
  // there, and the key it made is removed again.
  const std::string home = TestUsers::home(users_->stranger);
  ASSERT_EQ(::symlink("/etc", (home + "/.config").c_str()), 0);
  ASSERT_EQ(::lchown((home + "/.config").c_str(), 0, 0), 0);
  auto planted = asRoot({"keys", "create", "--for-user", users_->stranger, "--scope", "read"});
  EXPECT_NE(planted.exitCode, 0) << describeRun(planted);
  EXPECT_NE(planted.err.find("the key was revoked"), std::string::npos) << describeRun(planted);
  EXPECT_FALSE(os::exists("/etc/moat/token")) << "written through the user's link as root";
  auto keys = asRoot({"keys", "ls", "--json"});
  json listed = json::parse(keys.out, nullptr, false);
  ASSERT_TRUE(listed.is_array()) << keys.out;
  for (const auto& key : listed) {
    if (key.value("name", "") == users_->stranger) {
      EXPECT_EQ(key.value("revoked", false), true) << "a key nobody holds was left usable: " << key;
    }
  }

  // Without the link the key is saved, with a note that the socket is out of reach.
  ASSERT_EQ(::unlink((home + "/.config").c_str()), 0);
  auto noted = asRoot({"keys", "create", "--for-user", users_->stranger, "--scope", "read"});
  ASSERT_EQ(noted.exitCode, 0) << describeRun(noted);
  EXPECT_NE(noted.err.find("not a member of its group"), std::string::npos) << describeRun(noted);

  // Not root: --for-user is refused before any key is made.
  auto notRoot = moatAs(users_->stranger, {"keys", "create", "--for-user", users_->member, "--scope", "read"});
  EXPECT_EQ(notRoot.exitCode, 2) << describeRun(notRoot);
  EXPECT_NE(notRoot.err.find("needs root"), std::string::npos) << describeRun(notRoot);
  auto empty = asRoot({"keys", "create", "--for-user", "", "--scope", "read"});
  EXPECT_EQ(empty.exitCode, 2) << describeRun(empty);
  EXPECT_EQ(empty.out.find("moat_"), std::string::npos) << "a token printed: " << empty.out;
  auto unknown = asRoot({"keys", "create", "--for-user", "nobody-such-user-x", "--scope", "read"});
  EXPECT_NE(unknown.exitCode, 0);
  EXPECT_NE(unknown.err.find("no user nobody-such-user-x"), std::string::npos) << describeRun(unknown);
}

TEST(SocketGroupFlag, AGroupThatDoesNotExistIsRefusedAtTheStart) {
  MOAT_REQUIRE_ROOT();
  auto r =
      runProcess({binDir() + "/moatd", "--state", "/tmp/moat-no-group-state", "--socket-group", "no-such-group-moat"});
  EXPECT_EQ(r.exitCode, 1) << r.err;
  EXPECT_NE(r.err.find("--socket-group: no group no-such-group-moat in /etc/group"), std::string::npos) << r.err;
  EXPECT_FALSE(os::exists("/tmp/moat-no-group-state")) << "refused before anything was made";
}

}  // namespace
}  // namespace moat::test
