// The flight recorder keeps each stream's last instructions in order, marks the unfinished ones, forgets the
// oldest past its size, and formats into the report the watchdog prints.
#include <catch2/catch.hpp>

#include "runtime/flight_recorder.hpp"
#include "runtime/watchdog.hpp"

using namespace piper;

TEST_CASE("flight recorder: records in order, unfinished ones marked") {
  FlightRecorder fr;
  CHECK(fr.snapshot().empty());
  CHECK(fr.last_end() < 0);
  uint64_t a = fr.start(7, 3, 10.0);
  fr.finish(a, 10.5);
  uint64_t b = fr.start(8, 3, 11.0);
  auto r = fr.snapshot();
  REQUIRE(r.size() == 2);
  CHECK(r[0].instr == 7);
  CHECK(r[0].step == 3);
  CHECK(r[0].start == 10.0);
  CHECK(r[0].end == 10.5);
  CHECK(r[1].instr == 8);
  CHECK(r[1].end < 0);
  CHECK(fr.last_end() == 10.5);
  fr.finish(b, 12.0);
  CHECK(fr.snapshot()[1].end == 12.0);
  fr.waiting(9, 4);
  CHECK(fr.waiting_instr() == 9);
  CHECK(fr.waiting_on() == 4);
  fr.waiting(-1, -1);
  CHECK(fr.waiting_on() == -1);
}

TEST_CASE("flight recorder: a full ring keeps the newest records and ignores finishing a forgotten one") {
  FlightRecorder fr;
  const int n = FlightRecorder::kSize + 10;
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) ids.push_back(fr.start(i, i / 5, double(i)));
  for (int i = 1; i < n; ++i) fr.finish(ids[size_t(i)], i + 0.25);
  fr.finish(ids[0], 99.0);  // long overwritten: must not touch the slot that holds record kSize now
  auto r = fr.snapshot();
  REQUIRE(r.size() == size_t(FlightRecorder::kSize));
  for (int k = 0; k < FlightRecorder::kSize; ++k) {
    const int i = n - FlightRecorder::kSize + k;
    CHECK(r[size_t(k)].instr == i);
    CHECK(r[size_t(k)].step == i / 5);
    CHECK(r[size_t(k)].end == i + 0.25);
  }
}

TEST_CASE("flight report: names each stream's unfinished instruction, what it waits for, and its records") {
  Plan p;
  p.world = 2;
  p.sets = {{0, 1}};
  p.streams = {"compute", "dp"};
  p.groups = {GroupRef{GroupRef::Kind::DeviceSet, {0}, "dp"}};
  Instr update(Op::Update), reduce(Op::AllReduce), sync(Op::StepSync);
  std::get<UpdateArgs>(update.args).bucket = 0;
  reduce.stream = 1;
  reduce.args = CollectiveArgs{.bucket = 0, .group = 0};
  sync.waits = {1};
  p.instrs = {update, reduce, sync};
  FlightRecorder compute, dp;
  compute.finish(compute.start(0, 4, 100.0), 100.5);
  compute.waiting(2, 1);
  dp.start(1, 4, 101.0);
  const std::string text = flight_report(p, {&compute, &dp}, 100.0, 104.0);
  INFO(text);
  CHECK(text.find("stream 1 (dp): unfinished #1 ALL_REDUCE bucket0 set0/dp (ranks 0 1) of step 4, started 3.000 s ago") !=
        std::string::npos);
  CHECK(text.find("stream 0 (compute): waits for #1 ALL_REDUCE bucket0 set0/dp (ranks 0 1) [stream dp] before it "
                  "starts #2 STEP_SYNC") != std::string::npos);
  CHECK(text.find("stream 0 (compute): last 1 instructions, times in seconds since this step began here (now 4.000)") !=
        std::string::npos);
  CHECK(text.find("step      4  start     0.000  end      0.500  #0 UPDATE bucket0") != std::string::npos);
  CHECK(text.find("step      4  start     1.000  end unfinished  #1 ALL_REDUCE") != std::string::npos);
}
