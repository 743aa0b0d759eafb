// Named templates without root: the tar scanner that checks every layer
// against the limits before umoci sees it, the image config, the user's
// resolution inside the image's own tree, names and sources.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "isolation/fs/template.h"
#include "templates/image.h"
#include "templates/importer.h"
#include "templates/tar_scan.h"

namespace moat::templates {
namespace {

// One ustar header block (and its data, padded) as a tar writer makes it.
std::string entry(const std::string& name, char type, const std::string& data = "", uint64_t declared = UINT64_MAX) {
  char h[512];
  std::memset(h, 0, sizeof h);
  std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(h + 100, 8, "%07o", 0644);
  std::snprintf(h + 108, 8, "%07o", 0);
  std::snprintf(h + 116, 8, "%07o", 0);
  uint64_t size = declared == UINT64_MAX ? data.size() : declared;
  std::snprintf(h + 124, 12, "%011llo", static_cast<unsigned long long>(size));
  std::snprintf(h + 136, 12, "%011o", 0);
  h[156] = type;
  std::memcpy(h + 257, "ustar", 6);
  std::memcpy(h + 263, "00", 2);
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(h + 148, 8, "%06o", sum);
  std::string out(h, 512);
  out += data;
  out.append((512 - data.size() % 512) % 512, '\0');
  return out;
}

std::string pax(const std::string& records) { return entry("pax", 'x', records); }
std::string end() { return std::string(1024, '\0'); }

Status scan(const std::string& tar, LayerLimits limits, LayerTally& tally, size_t piece = 7) {
  TarScanner s(limits, tally, "layer 1");
  for (size_t i = 0; i < tar.size(); i += piece) MOAT_TRY(s.feed(std::string_view(tar).substr(i, piece)));
  return s.finish();
}

TEST(TemplateTarScan, CountsEntriesDataAndDevicesFedInAnyPieces) {
  std::string tar = entry("a", '0', "hello") + entry("d/", '5') + entry("l", '2') + entry("dev", '3') +
                    entry("blk", '4') + entry("../up", '0', "x") + entry("/abs", '0', "yy") + end();
  LayerTally tally;
  ASSERT_TRUE(scan(tar, {1000, 1000}, tally).ok());
  EXPECT_EQ(tally.entries, 7u);
  EXPECT_EQ(tally.bytes, 8u);
  EXPECT_EQ(tally.devices, 2u);
  EXPECT_EQ(tally.escaping, 2u);
}

TEST(TemplateTarScan, TheEntryLimitStopsTheScan) {
  std::string tar;
  for (int i = 0; i < 20; ++i) tar += entry("f" + std::to_string(i), '0');
  LayerTally tally;
  Status s = scan(tar + end(), {1000, 10}, tally);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Code::kTooLarge);
  EXPECT_NE(s.error().message().find("more than 10 files"), std::string::npos) << s.error().message();
}

TEST(TemplateTarScan, TheByteLimitCountsDeclaredSizesIncludingPaxOverrides) {
  // A header saying 0 with a pax size of 4 GiB: the pax size is what an
  // unpacker writes, so it is what counts (the data never needs to arrive).
  std::string tar = pax("19 size=4294967296\n") + entry("big", '0', "", 0);
  LayerTally tally;
  Status s = scan(tar, {1u << 20, 1000}, tally);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, Code::kTooLarge);
  // Over several layers: the tally adds up.
  LayerTally sum;
  ASSERT_TRUE(scan(entry("a", '0', std::string(600, 'a')) + end(), {1000, 100}, sum).ok());
  Status second = scan(entry("b", '0', std::string(600, 'b')) + end(), {1000, 100}, sum);
  EXPECT_FALSE(second.ok());
}

TEST(TemplateTarScan, PaxPathsAndGnuLongNamesAreTheNamesChecked) {
  LayerTally tally;
  ASSERT_TRUE(scan(pax("18 path=../../etc\n") + entry("harmless", '0') + entry("././@LongLink", 'L', "../x") +
                       entry("short", '0') + end(),
                   {1000, 1000}, tally)
                  .ok());
  EXPECT_EQ(tally.entries, 2u) << "metadata entries are not files";
  EXPECT_EQ(tally.escaping, 2u);
}

TEST(TemplateTarScan, SparseFilesAndBrokenStreamsAreRefused) {
  LayerTally tally;
  Status sparse = scan(entry("s", 'S', "") + end(), {1000, 1000}, tally);
  ASSERT_FALSE(sparse.ok());
  EXPECT_NE(sparse.error().message().find("sparse"), std::string::npos);
  Status paxSparse = scan(pax("22 GNU.sparse.major=1\n") + entry("s", '0') + end(), {1000, 1000}, tally);
  EXPECT_FALSE(paxSparse.ok());
  std::string bad = entry("a", '0', "x");
  bad[148] = '7';  // the checksum
  Status corrupt = scan(bad + end(), {1000, 1000}, tally);
  ASSERT_FALSE(corrupt.ok());
  EXPECT_NE(corrupt.error().message().find("checksum"), std::string::npos);
  Status cut = scan(entry("a", '0', std::string(1000, 'x')).substr(0, 700), {10000, 1000}, tally);
  ASSERT_FALSE(cut.ok());
  EXPECT_NE(cut.error().message().find("ends inside an entry"), std::string::npos);
}

TEST(TemplateTarScan, NumbersInOctalAndBase256) {
  EXPECT_EQ(tarNumber("00000000017 ").value(), 15u);
  std::string b256(12, '\0');
  b256[0] = static_cast<char>(0x80);
  b256[10] = 0x01;  // 256
  EXPECT_EQ(tarNumber(b256).value(), 256u);
  EXPECT_FALSE(tarNumber("12x").ok());
}

TEST(TemplateImage, ConfigFieldsAreReadAndCheckedAndRoundTrip) {
  auto c = parseImageConfig(R"({"config":{"Env":["PATH=/bin","A=b=c"],"WorkingDir":"/app","User":"1000:1000",
                                "Entrypoint":["/init"],"Cmd":["sh","-c","x"]}})");
  ASSERT_TRUE(c.ok()) << c.error().message();
  EXPECT_EQ(c->env, (std::vector<std::string>{"PATH=/bin", "A=b=c"}));
  EXPECT_EQ(c->workingDir, "/app");
  EXPECT_EQ(c->user, "1000:1000");
  EXPECT_EQ(c->entrypoint, std::vector<std::string>{"/init"});
  EXPECT_EQ(c->cmd.size(), 3u);
  ImageConfig back = configFromJson(configJson(c.value()));
  EXPECT_EQ(back.env, c->env);
  EXPECT_EQ(back.workingDir, "/app");
  EXPECT_TRUE(parseImageConfig(R"({"config":null})").ok());
  EXPECT_FALSE(parseImageConfig(R"({"config":{"Env":["NOEQUALS"]}})").ok());
  EXPECT_FALSE(parseImageConfig(R"({"config":{"WorkingDir":"relative"}})").ok());
  EXPECT_FALSE(parseImageConfig(R"({"config":{"Cmd":"sh"}})").ok());
  EXPECT_FALSE(parseImageConfig("not json").ok());
}

class ImageTree : public ::testing::Test {
 protected:
  void SetUp() override {
    char path[] = "/tmp/moat-image-tree-XXXXXX";
    ASSERT_NE(::mkdtemp(path), nullptr);
    dir_ = path;
    std::filesystem::create_directories(dir_ + "/etc");
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  Result<ImageConfig> resolve(const std::string& user) {
    ImageConfig c;
    c.user = user;
    int fd = ::open(dir_.c_str(), O_PATH | O_DIRECTORY);
    Status s = resolveUser(fd, c);
    ::close(fd);
    if (!s.ok()) return s.error();
    return c;
  }
  std::string dir_;
};

TEST_F(ImageTree, UsersAreFoundInTheImagesOwnFilesNeverTheHosts) {
  std::ofstream(dir_ + "/etc/passwd") << "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n";
  std::ofstream(dir_ + "/etc/group") << "staff:x:50:\n";
  EXPECT_EQ(resolve("app")->uid, 1000u);
  EXPECT_EQ(resolve("app")->gid, 1001u);
  EXPECT_EQ(resolve("app")->home, "/home/app");
  EXPECT_EQ(resolve("app:staff")->gid, 50u);
  EXPECT_EQ(resolve("1000")->home, "/home/app");
  EXPECT_EQ(resolve("4242:7")->uid, 4242u);
  EXPECT_EQ(resolve("4242:7")->gid, 7u);
  EXPECT_EQ(resolve("")->uid, 0u);
  EXPECT_FALSE(resolve("ghost").ok());
  EXPECT_FALSE(resolve("app:nogroup").ok());
  EXPECT_FALSE(resolve("70000").ok()) << "beyond the 65536 ids an environment maps";
  // An /etc/passwd that is a symlink out of the tree resolves inside it.
  std::filesystem::remove(dir_ + "/etc/passwd");
  std::filesystem::create_symlink("/etc/passwd", dir_ + "/etc/passwd");
  EXPECT_FALSE(resolve("root").ok() && resolve("daemon").ok()) << "the host's passwd was read";
  EXPECT_FALSE(resolve("daemon").ok());
}

// A hostile image's /etc/passwd that is a FIFO: the lookup answers (the user
// is unknown) instead of waiting for a writer for ever.
TEST_F(ImageTree, AnEtcPasswdThatIsAFifoIsNoFileAndNeverWaitedOn) {
  ASSERT_EQ(::mkfifo((dir_ + "/etc/passwd").c_str(), 0644), 0);
  ASSERT_EQ(::mkfifo((dir_ + "/etc/group").c_str(), 0644), 0);
  EXPECT_FALSE(resolve("app").ok());
  EXPECT_FALSE(resolve("1000:staff").ok());
  EXPECT_EQ(resolve("1000:7")->uid, 1000u) << "numeric ids need no file";
}

TEST(TemplateNames, TheContractsRule) {
  for (const std::string& ok :
       std::vector<std::string>{"python:3.12", "a", "debian-bookworm", "x.y_z", std::string(64, 'a')}) {
    EXPECT_TRUE(isolation::fs::isTemplateName(ok)) << ok;
  }
  for (const std::string& bad :
       std::vector<std::string>{"", "host", "Upper", ":x", ".x", "a/b", "..", "a b", std::string(65, 'a')}) {
    EXPECT_FALSE(isolation::fs::isTemplateName(bad)) << bad;
  }
}

TEST(TemplateSources, TransportsAndTheirPaths) {
  EXPECT_EQ(parseSource("docker-archive:/x.tar")->transport, "docker-archive");
  EXPECT_EQ(parseSource("oci:/layout:tag")->skopeoReference(), "oci:/layout:tag");
  EXPECT_EQ(parseSource("docker://debian:bookworm")->skopeoReference(), "docker://debian:bookworm");
  EXPECT_FALSE(parseSource("docker://debian:bookworm")->namesHostPath());
  EXPECT_TRUE(parseSource("oci-archive:/a.tar")->namesHostPath());
  for (const char* bad : {"oci:relative", "docker://", "http://x", "docker-archive:", "x"}) {
    EXPECT_FALSE(parseSource(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace moat::templates
